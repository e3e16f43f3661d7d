"""The delivery decisions as pure functions: from an item, its evidence, the policy and `now`.

Whether a claimed digest may still be sent, what an attempt's outcome moves it to, when an
`unknown` item's retention has run out and why the sweeper should run for an item are each
decided here once, with no I/O and no clock: the deliverer, reconciliation and the sensor call
these and record or act on what they return (issue 14, first step).
"""

from datetime import datetime, timedelta
from typing import Any

from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import Claim, Transition, WorkItem
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.retry import (
    DeadLetter,
    DeadLetterReason,
    Fail,
    RandomSource,
    Reconcile,
    RetryAt,
    decide,
)
from digest_pipeline.domain.states import CLAIMABLE, DeliveryState


def move(claim: Claim, target: DeliveryState, now: datetime, **fields: Any) -> Transition:
    """A guarded move of a claimed item: applied only while it is still claimed with its token."""
    return Transition(claim.key, DeliveryState.CLAIMED, claim.token, target, now, **fields)


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
            claim, DeliveryState.DEAD_LETTERED, now, detail=reason, dead_letter_reason=reason
        )
    return None


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
    failure: dict[str, Any] = {
        "failure_class": fc,
        "detail": outcome.detail,
        "refund_budget": throttled,
    }
    match decision:
        case RetryAt(at):
            return move(claim, DeliveryState.RETRY_SCHEDULED, now, next_attempt_at=at, **failure)
        case DeadLetter(reason) | Fail(reason) if item.dedupe_until is not None:
            # This was a resend of an attempt whose outcome is unknown: the first may have been
            # delivered, so the item is not "failed"; a replay must reconcile it first.
            failure["detail"] = f"{reason.value}:{outcome.detail}"
            unresolved = DeadLetterReason.UNKNOWN_UNRESOLVED.value
            return move(
                claim, DeliveryState.DEAD_LETTERED, now, dead_letter_reason=unresolved, **failure
            )
        case DeadLetter(reason) | Fail(reason):
            target = (
                DeliveryState.FAILED if isinstance(decision, Fail) else DeliveryState.DEAD_LETTERED
            )
            return move(claim, target, now, dead_letter_reason=reason.value, **failure)
        case Reconcile():
            return move(claim, DeliveryState.UNKNOWN, now, **failure)
    raise AssertionError(f"unhandled decision {decision!r}")


def unknown_expired(item: WorkItem, now: datetime, retention: timedelta) -> bool:
    """An `unknown` item whose retention ran out: the next run dead-letters it unresolved."""
    return now >= (item.last_attempt_at or item.created_at) + retention


def is_due(item: WorkItem, now: datetime) -> bool:
    """An item a delivery run may claim now (the SQL ledger's `claim_due` asks the same)."""
    return (
        item.state in CLAIMABLE and item.next_attempt_at is not None and item.next_attempt_at <= now
    )


def sweep_reason(item: WorkItem, now: datetime, unknown_retention: timedelta) -> str | None:
    """Why a delivery run could move `item` now (the sensor's fingerprint part), or None."""
    if is_due(item, now):
        return item.state.value
    if item.state is DeliveryState.CLAIMED and item.lease_expires_at is not None:
        return "claimed_expired" if item.lease_expires_at <= now else None
    if item.state is DeliveryState.UNKNOWN:
        # past its retention an unknown item is dead-lettered by the next run: a new key for it
        return "unknown_expired" if unknown_expired(item, now, unknown_retention) else "unknown"
    return None
