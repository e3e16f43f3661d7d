"""One claim's delivery as two pure steps: what to do before its send, and what its outcome records.

The use case (services/deliver.py) feeds each step what the ledger holds (the period's facts,
read at most once a lease; the claim's earlier attempts) and records what the step returns.
Nothing here reads the ledger or the clock, so every decision between a claim and its recorded
outcome is made, and tested, in this one module.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from digest_pipeline.domain.bounces import hard_bounce
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.feedback import Suppression
from digest_pipeline.domain.mailer_identity import foreign_mailers
from digest_pipeline.domain.model import (
    Attempt,
    Claim,
    Effect,
    RefundBudget,
    Transition,
    WorkItem,
    WriteDeadLetter,
)
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.reconciliation import Evidence, confirmed, reconciled
from digest_pipeline.domain.retry import (
    DeadLetter,
    DeadLetterReason,
    Fail,
    RandomSource,
    Reconcile,
    RetryAt,
    decide,
)
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.domain.transitions import move

#: `last_detail` of a claim given back because its lease ran out before its attempt started
LEASE_EXPIRED_BEFORE_ATTEMPT = "lease_expired_before_attempt"
#: `last_detail` of a resend claimed by a mailer other than the one whose deduplication it needs
NEEDS_MAILER = "needs_mailer"
#: `last_detail` of a claim given back unsent because its period's snapshot changed
SNAPSHOT_TAMPERED = "snapshot_tampered"


@dataclass(frozen=True)
class PeriodFacts:
    """What every claim of a period is checked against, read from the ledger at most once a lease.

    A claim outlives no lease, so facts read within one are current for every claim sent under it.
    """

    read_at: datetime
    #: the delivery window's close, an operator's late grant included
    closes_at: datetime
    #: the refusal line of a period whose frozen snapshot changed, or None while it holds
    refusal: str | None

    def current(self, now: datetime, lease: timedelta) -> bool:
        """Whether these facts were read within the lease that ends at `now`."""
        return self.read_at <= now < self.read_at + lease


@dataclass(frozen=True)
class GiveBack:
    """The claim goes back to the queue unsent, due now, with no attempt started."""

    why: str


@dataclass(frozen=True)
class Instead:
    """The claim must not be sent: this move is recorded instead, closing no attempt."""

    transition: Transition


@dataclass(frozen=True)
class Send:
    """The claim may be sent: its attempt starts, checked against this window close (None: a replay)."""

    closes_at: datetime | None


Step = GiveBack | Instead | Send


@dataclass(frozen=True)
class Outcome:
    """What a finished attempt records: the move, and the suppression a hard bounce means."""

    transition: Transition
    outcome: SendOutcome
    suppression: Suppression | None

    @property
    def routine(self) -> bool:
        """A plain `sent`, the common case, which the use case logs only at DEBUG."""
        return self.transition.target is DeliveryState.SENT and not self.outcome.duplicate


def before_attempt(
    claim: Claim,
    facts: PeriodFacts,
    history: Sequence[Attempt],
    mailer: str,
    now: datetime,
    policy: DeliveryPolicy,
    actor: str,
) -> Step:
    """What happens to `claim` instead of, or before, its send.

    `history` is the claim's recorded attempts (empty for a first attempt), `mailer` the identity
    of the mailer that would send, `actor` the name an evidence move is audited under.
    """
    if facts.refusal is not None:
        # Fencing: whoever claimed it and however long ago, no attempt starts once the period's
        # snapshot changed.
        return GiveBack(SNAPSHOT_TAMPERED)
    closes_at = None if claim.item.replayed_at is not None else facts.closes_at
    instead = before_send(claim, closes_at, now, policy)
    if instead is None and history:
        instead = already_confirmed(claim, history, now, actor) or resend_through_other_mailer(
            claim, history, mailer, now
        )
    return Send(closes_at) if instead is None else Instead(instead)


def after_send(
    claim: Claim,
    outcome: SendOutcome,
    *,
    started_at: datetime,
    closes_at: datetime | None,
    now: datetime,
    policy: DeliveryPolicy,
    rand: RandomSource,
) -> Outcome:
    """What the outcome of the attempt started at `started_at` records."""
    transition = after_attempt(
        claim,
        outcome,
        started_at=started_at,
        closes_at=closes_at,
        now=now,
        policy=policy,
        rand=rand,
    )
    return Outcome(transition, outcome, hard_bounce(claim.key.customer_id, outcome, transition.at))


def before_send(
    claim: Claim, closes_at: datetime | None, now: datetime, policy: DeliveryPolicy
) -> Transition | None:
    """The move that must replace a send of `claim` now, or None when it may be sent.

    `closes_at` is the delivery window's close (None for a replay, which has none).
    """
    item = claim.item
    closed = closes_at is not None and now >= closes_at
    if item.dedupe_until is not None and (closed or now + policy.lease >= item.dedupe_until):
        # A resend that only the provider's deduplication made safe, and that guarantee (or the
        # delivery window) has run out: back to `unknown`, never a blind send.
        return move(claim, DeliveryState.UNKNOWN, now, detail="dedupe_window_passed")
    if closed:
        reason = DeadLetterReason.WINDOW_CLOSED.value
        return move(
            claim,
            DeliveryState.DEAD_LETTERED,
            now,
            detail=reason,
            effects=(WriteDeadLetter(reason),),
        )
    return None


def already_confirmed(
    claim: Claim, history: Sequence[Attempt], now: datetime, actor: str
) -> Transition | None:
    """Ledger first: a retry whose earlier attempt was confirmed late is recorded, not resent."""
    if (attempt := confirmed(history)) is None:
        return None
    return move(
        claim,
        DeliveryState.SENT,
        now,
        provider_message_id=attempt.provider_message_id,
        **reconciled(Evidence.LEDGER_ATTEMPT, actor),
    )


def resend_through_other_mailer(
    claim: Claim, history: Sequence[Attempt], mailer: str, now: datetime
) -> Transition | None:
    """A resend only the first mailer's deduplication makes safe, claimed under another: `unknown`.

    Another mailer would deliver a second copy, so the item goes back to `unknown` (not sent,
    not retried) until the mailer that made its uncertain attempt reconciles it, or an operator
    resolves it.
    """
    if claim.item.dedupe_until is None or not (needed := foreign_mailers(history, mailer)):
        return None
    return move(claim, DeliveryState.UNKNOWN, now, detail=f"{NEEDS_MAILER}:{needed[0]}")


def release(claim: Claim, now: datetime, why: str) -> Transition:
    """A claim that was never attempted goes back to the queue, due now."""
    return move(claim, DeliveryState.RETRY_SCHEDULED, now, next_attempt_at=now, detail=why)


def requeue_unstarted(
    claim: Claim, current: WorkItem | None, history: Sequence[Attempt], now: datetime
) -> Transition | None:
    """The release of a claim whose attempt could not start, or None when it must stay put.

    Only while the item is still this claim and no attempt under its token is open: an open
    attempt means a send may be in flight, and such an item is never requeued.
    """
    in_flight = any(a.token == claim.token and a.finished_at is None for a in history)
    if (
        current is None
        or current.state is not DeliveryState.CLAIMED
        or current.lease_token != claim.token
        or in_flight
    ):
        return None
    return release(claim, now, LEASE_EXPIRED_BEFORE_ATTEMPT)


def after_attempt(
    claim: Claim,
    outcome: SendOutcome,
    *,
    started_at: datetime,
    closes_at: datetime | None,
    now: datetime,
    policy: DeliveryPolicy,
    rand: RandomSource,
) -> Transition:
    """What the outcome of the attempt started at `started_at` moves the claimed item to."""
    fc = outcome.failure_class
    if fc is None:
        return move(claim, DeliveryState.SENT, now, provider_message_id=outcome.provider_message_id)
    throttled = fc is FailureClass.THROTTLED
    item = claim.item
    decision = decide(
        fc,
        # the start of this attempt took one unit; a throttle gives it back
        budget_used=item.budget_used + (0 if throttled else 1),
        window_started_at=item.window_started_at or started_at,
        now=now,
        policy=policy.retry,
        rand=rand,
        retry_after=outcome.retry_after,
        delivery_closes_at=closes_at,
    )
    refund: tuple[Effect, ...] = (RefundBudget(),) if throttled else ()
    failure: dict[str, Any] = {"failure_class": fc, "detail": outcome.detail}
    match decision:
        case RetryAt(at):
            return move(
                claim,
                DeliveryState.RETRY_SCHEDULED,
                now,
                next_attempt_at=at,
                effects=refund,
                **failure,
            )
        case DeadLetter(reason) | Fail(reason) if item.dedupe_until is not None:
            # This was a resend of an attempt whose outcome is unknown: the first may have been
            # delivered, so the item is not "failed"; a replay must reconcile it first.
            failure["detail"] = f"{reason.value}:{outcome.detail}"
            unresolved = WriteDeadLetter(DeadLetterReason.UNKNOWN_UNRESOLVED.value)
            return move(
                claim, DeliveryState.DEAD_LETTERED, now, effects=(*refund, unresolved), **failure
            )
        case DeadLetter(reason) | Fail(reason):
            target = (
                DeliveryState.FAILED if isinstance(decision, Fail) else DeliveryState.DEAD_LETTERED
            )
            effects = (*refund, WriteDeadLetter(reason.value))
            return move(claim, target, now, effects=effects, **failure)
        case Reconcile():
            return move(claim, DeliveryState.UNKNOWN, now, effects=refund, **failure)
    raise AssertionError(f"unhandled decision {decision!r}")
