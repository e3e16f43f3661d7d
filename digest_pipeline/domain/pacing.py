"""The install's send pace and pause: what a provider's rate limit and quota ask of every sender.

Every sender of an install takes its send slot from one shared budget (`DIGEST_SEND_RATE`), and a
provider's "slow down until then" (a throttled answer with Retry-After) or "quota spent" pauses
them all, not one item. These are the pure rules; the budget itself lives in the ledger's database.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from digest_pipeline.domain.failures import FailureClass, SendOutcome

#: slots are spaced for this share of the configured rate: the requests leave on time but reach
#: the provider with the network's and the scheduler's jitter, and a window that counts arrivals
#: must still see no more than the rate (5 % of a second's slots absorbs ±25 ms of jitter at any
#: rate)
HEADROOM = 0.95
#: how long a pause lasts when the provider says its quota is spent without saying until when:
#: each later sweep costs one refused request at most, and the week waits instead of failing
QUOTA_PAUSE = timedelta(hours=1)
#: a send waits for its slot or a short pause up to this; a longer one ends the run, what it had
#: not sent stays due (its attempt is already recorded as started, and a lease is minutes)
MAX_WAIT = timedelta(seconds=30)


#: a send that takes its slot up to this late keeps the schedule (the next slot stays one
#: interval after the one it missed); a later one starts a new schedule from now. Any run of
#: sends then spans its intervals less this at most, whatever the scheduler's delays: well
#: within the 5 % headroom at any rate, leaving the rest for the jitter between a take and the
#: request's arrival (a process's first request opens its connection)
SLACK = timedelta(milliseconds=10)


@dataclass(frozen=True)
class Pause:
    """Every sender of the install waits until `until`; `why` is the provider's detail code."""

    until: datetime
    why: str


@dataclass(frozen=True)
class Slot:
    """A sender's try for the next send slot: taken now, or when the next one is free."""

    taken: bool
    #: when the next slot is free (after this one, if taken): not before a pause ends
    free_at: datetime
    #: the pause in force, if any
    pause: Pause | None = None


def slot_interval(rate: float) -> timedelta:
    """The spacing of send slots at `rate` messages per second, headroom included."""
    return timedelta(seconds=1 / (rate * HEADROOM))


def wait_bound(lease: timedelta) -> timedelta:
    """The longest a started attempt waits for its slot: `MAX_WAIT`, or a quarter of the lease."""
    return min(MAX_WAIT, lease / 4)


def paced_concurrency(concurrency: int, rate: float | None, lease: timedelta) -> int:
    """The sends one worker keeps in flight at `rate`: no more than wait half the wait bound.

    Each send in flight holds a slot, so more of them than the rate serves in that time would
    only queue for slots a started attempt may not wait for.
    """
    if rate is None:
        return concurrency
    return max(1, min(concurrency, int(rate * wait_bound(lease).total_seconds() / 2)))


def pause_after(outcome: SendOutcome, now: datetime) -> Pause | None:
    """The pause a refused send asks of every sender, or None.

    A quota refusal pauses for the provider's Retry-After or `QUOTA_PAUSE`; a throttled answer
    pauses only when the provider said for how long (a throttle without a wait is one item's
    backoff, as the retry policy decides).
    """
    if outcome.failure_class is not FailureClass.THROTTLED:
        return None
    if outcome.quota:
        return Pause(now + (outcome.retry_after or QUOTA_PAUSE), outcome.detail)
    if outcome.retry_after is not None and outcome.retry_after > timedelta(0):
        return Pause(now + outcome.retry_after, outcome.detail)
    return None


def held_back(pause: Pause, now: datetime) -> SendOutcome:
    """The outcome of an attempt a pause kept from leaving: throttled until the pause ends.

    Nothing left, so the item is due again after the pause, and a throttled outcome spends none
    of its attempt budget.
    """
    return SendOutcome.failed(
        FailureClass.THROTTLED,
        f"paused:{pause.why}"[:200],
        retry_after=max(pause.until - now, timedelta(0)),
    )


def stop_line(pause: Pause) -> str:
    """The one line a run that a pause stopped ends with."""
    return (
        f"sending paused until {pause.until:%Y-%m-%d %H:%M:%S} UTC: the provider answered "
        f"{pause.why}; what was not sent stays due and goes out after the pause"
    )
