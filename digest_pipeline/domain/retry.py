"""Retry bounds and the pure decision that follows a failed attempt.

The delay is capped exponential backoff with full jitter (AWS Architecture Blog, "Exponential
Backoff and Jitter"): `uniform(0, min(cap, base * 2**(n-1)))`. A retry is bounded by attempts
*and* age; the random source is a parameter so tests and the simulator are exact.
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from digest_pipeline.domain.errors import InvalidPolicy
from digest_pipeline.domain.failures import FailureClass

#: A source of floats in [0, 1): `random.Random(seed).random` in production and the simulator.
RandomSource = Callable[[], float]


class DeadLetterReason(StrEnum):
    """Why an item stopped being retried automatically."""

    #: the attempt budget (transient failures) is spent
    MAX_ATTEMPTS = "max_attempts"
    #: the next retry would fall after first attempt + max age
    MAX_AGE = "max_age"
    #: the period's delivery window closed; a late digest is not sent unless replayed
    WINDOW_CLOSED = "window_closed"
    #: an `unknown` item stayed unresolved past its retention
    UNKNOWN_UNRESOLVED = "unknown_unresolved"
    #: a permanent failure; the item is `failed` and this row records it for replay
    PERMANENT = "permanent"


@dataclass(frozen=True)
class RetryPolicy:
    """Bounds for automatic retries; every field is configuration (`DIGEST_RETRY_*`)."""

    base: timedelta = timedelta(seconds=30)
    cap: timedelta = timedelta(hours=1)
    max_attempts: int = 10
    max_age: timedelta = timedelta(hours=24)

    def __post_init__(self) -> None:
        if self.base <= timedelta(0):
            raise InvalidPolicy("retry base must be positive")
        if self.cap < self.base:
            raise InvalidPolicy("retry cap must be at least the base")
        if self.max_attempts < 1:
            raise InvalidPolicy("max attempts must be at least 1")
        if self.max_age <= timedelta(0):
            raise InvalidPolicy("max age must be positive")


def retry_delay_bound(attempt: int, policy: RetryPolicy) -> timedelta:
    """The upper bound of the delay after failed attempt `attempt` (1-based)."""
    if attempt < 1:
        raise InvalidPolicy(f"attempt numbers start at 1, got {attempt}")
    # Once base * 2**d passes the cap the answer is the cap; stop before doubling overflows
    # timedelta (which it does near attempt 43 with a 30 s base).
    if attempt - 1 >= (policy.cap // policy.base).bit_length():
        return policy.cap
    return min(policy.cap, policy.base * (1 << (attempt - 1)))


def retry_delay(attempt: int, policy: RetryPolicy, rand: RandomSource) -> timedelta:
    """Full jitter: a uniform draw in [0, bound) so that retries of one outage spread out."""
    return retry_delay_bound(attempt, policy) * rand()


@dataclass(frozen=True)
class RetryAt:
    """Schedule the next attempt at `at`."""

    at: datetime


@dataclass(frozen=True)
class DeadLetter:
    """Stop retrying: a bound was hit."""

    reason: DeadLetterReason


@dataclass(frozen=True)
class Fail:
    """Terminal failure: retrying cannot help."""

    reason: DeadLetterReason = DeadLetterReason.PERMANENT


@dataclass(frozen=True)
class Reconcile:
    """The send may have happened: move to `unknown` and reconcile, never to "not sent"."""


Decision = RetryAt | DeadLetter | Fail | Reconcile


def decide(
    failure_class: FailureClass,
    *,
    budget_used: int,
    window_started_at: datetime,
    now: datetime,
    policy: RetryPolicy,
    rand: RandomSource,
    retry_after: timedelta | None = None,
    delivery_closes_at: datetime | None = None,
) -> Decision:
    """What follows a failed attempt.

    Args:
        failure_class: the class of the attempt that just failed.
        budget_used: attempts counted against `max_attempts`, this one included; throttled
            attempts do not count, so throttling never burns the budget faster than transients.
        window_started_at: first attempt since the item was (re)opened; `max_age` runs from here.
        now: the time of the decision.
        policy: the retry bounds.
        rand: the jitter source.
        retry_after: the provider's requested wait, honoured for throttled outcomes.
        delivery_closes_at: when the period's digest stops being worth sending, if it ever does.
    """
    if failure_class is FailureClass.PERMANENT:
        return Fail()
    if failure_class is FailureClass.UNKNOWN:
        return Reconcile()
    if failure_class is FailureClass.TRANSIENT:
        if budget_used >= policy.max_attempts:
            return DeadLetter(DeadLetterReason.MAX_ATTEMPTS)
        at = now + retry_delay(budget_used, policy, rand)
    else:
        # Throttled: never earlier than the provider asked, plus jitter so that every item
        # throttled in the same second does not wake in the same second again.
        wait = retry_after if retry_after is not None and retry_after > timedelta(0) else None
        base_wait = wait if wait is not None else retry_delay_bound(max(budget_used, 1), policy)
        at = now + base_wait + policy.base * rand()
    if at > window_started_at + policy.max_age:
        return DeadLetter(DeadLetterReason.MAX_AGE)
    if delivery_closes_at is not None and at >= delivery_closes_at:
        return DeadLetter(DeadLetterReason.WINDOW_CLOSED)
    return RetryAt(at)
