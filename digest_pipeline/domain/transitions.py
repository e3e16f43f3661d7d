"""The delivery decisions as pure functions: from an item, its evidence, the policy and `now`.

Whether a claimed digest may still be sent, what an attempt's outcome moves it to, when an
`unknown` item's retention has run out and why the sweeper should run for an item are each
decided here once, with no I/O and no clock: the deliverer, reconciliation and the sensor call
these and record or act on what they return. What evidence settles an `unknown` item is
`domain.reconciliation`'s decision, made with the moves defined here.
"""

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from digest_pipeline.domain.errors import LostRace, ResolveRefused
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.mailer_identity import foreign_mailers
from digest_pipeline.domain.model import (
    Attempt,
    AuditNote,
    Claim,
    ClearDedupe,
    Effect,
    RefundBudget,
    Reopen,
    Transition,
    WorkItem,
    WriteDeadLetter,
)
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
from digest_pipeline.domain.states import CLAIMABLE, DeliveryState, check_transition


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
            claim,
            DeliveryState.DEAD_LETTERED,
            now,
            detail=reason,
            effects=(WriteDeadLetter(reason),),
        )
    return None


#: `last_detail` of a claim given back because its lease ran out before its attempt started
LEASE_EXPIRED_BEFORE_ATTEMPT = "lease_expired_before_attempt"


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


def replayed(item: WorkItem, now: datetime, audit: AuditNote) -> Transition:
    """An operator's replay: the item is `pending` and due now, with a fresh attempt budget.

    Whether the replay may happen at all (its evidence, a possible duplicate) is the replay
    plan's decision; this is only the move it records.
    """
    return Transition(
        item.key,
        item.state,
        item.lease_token,
        DeliveryState.PENDING,
        now,
        next_attempt_at=now,
        detail="replayed",
        effects=(Reopen(),),
        audit=audit,
    )


def resolved(item: WorkItem, sent: bool, now: datetime, audit: AuditNote) -> Transition:
    """An operator's word on an `unknown` item: `sent`, or not sent and so due again now.

    The operator's word is the evidence, so a resend needs no deduplication window.
    """
    if item.state is not DeliveryState.UNKNOWN:
        raise ResolveRefused(
            f"{item.key} is {item.state.value}; only unknown items can be resolved"
        )
    return Transition(
        item.key,
        DeliveryState.UNKNOWN,
        item.lease_token,
        DeliveryState.SENT if sent else DeliveryState.RETRY_SCHEDULED,
        now,
        next_attempt_at=None if sent else now,
        detail="resolved_sent" if sent else "resolved_not_sent",
        effects=() if sent else (ClearDedupe(),),
        audit=audit,
    )


#: `last_detail` of a resend claimed by a mailer other than the one whose deduplication it needs
NEEDS_MAILER = "needs_mailer"


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


def claimed(item: WorkItem, owner: str, now: datetime, lease: timedelta) -> Claim:
    """A due item leased to `owner` until `now + lease`, with the next fencing token."""
    if not is_due(item, now):
        raise LostRace(f"{item.key}: {item.state.value} is not due at {now.isoformat()}")
    token = item.lease_token + 1
    expires_at = now + lease
    leased = replace(
        item,
        state=DeliveryState.CLAIMED,
        lease_owner=owner,
        lease_token=token,
        lease_expires_at=expires_at,
        first_claimed_at=item.first_claimed_at or now,
        next_attempt_at=None,
    )
    return Claim(leased, token, owner, expires_at)


def attempt_started(claim: Claim, item: WorkItem, now: datetime) -> WorkItem:
    """The item once an attempt under `claim` is recorded as started (one budget unit taken).

    Raises LostRace unless the item is still this claim with its lease live.
    """
    if not (
        item.state is DeliveryState.CLAIMED
        and item.lease_token == claim.token
        and item.lease_expires_at is not None
        and item.lease_expires_at > now
    ):
        raise LostRace(f"{item.key}: lease lost before the attempt started")
    return replace(
        item,
        attempts=item.attempts + 1,
        budget_used=item.budget_used + 1,
        first_attempt_at=item.first_attempt_at or now,
        window_started_at=item.window_started_at or now,
        last_attempt_at=now,
    )


def cleaned(item: WorkItem, token: int, now: datetime) -> WorkItem:
    """A `sent` item once its rows are gone; LostRace unless it is `sent` with `token`."""
    if item.state is not DeliveryState.SENT or item.lease_token != token:
        raise LostRace(
            f"{item.key}: expected sent with token {token}; cleanup refused, nothing changed"
        )
    return replace(item, state=DeliveryState.CLEANED, cleaned_at=now)


#: the stored length of `last_detail` (the column is VARCHAR(200))
DETAIL_LENGTH = 200


def apply(item: WorkItem, t: Transition) -> WorkItem:
    """The item after `t`: what every ledger stores for it (the SQL ledger is held to this).

    Raises LostRace when the item is no longer `t.expected` with `t.token`, and
    InvalidTransition for a move the state table does not allow.
    """
    check_transition(t.expected, t.target)
    if item.key != t.key or item.state is not t.expected or item.lease_token != t.token:
        raise LostRace(
            f"{t.key}: expected {t.expected.value} with token {t.token};"
            " another worker or operator changed it first"
        )
    clear_lease = t.target is not DeliveryState.CLAIMED
    budget = item.budget_used - 1 if t.has(RefundBudget) else item.budget_used
    reopen = t.has(Reopen)
    dedupe = item.dedupe_until if t.resend_until is None else t.resend_until
    return replace(
        item,
        state=t.target,
        next_attempt_at=t.next_attempt_at,
        lease_owner=None if clear_lease else item.lease_owner,
        lease_expires_at=None if clear_lease else item.lease_expires_at,
        last_failure_class=item.last_failure_class if t.failure_class is None else t.failure_class,
        last_detail=item.last_detail if t.detail is None else t.detail[:DETAIL_LENGTH],
        provider_message_id=(
            item.provider_message_id if t.provider_message_id is None else t.provider_message_id
        ),
        sent_at=t.at if t.target is DeliveryState.SENT else item.sent_at,
        budget_used=0 if reopen else budget,
        window_started_at=None if reopen else item.window_started_at,
        replayed_at=t.at if reopen else item.replayed_at,
        dedupe_until=None if reopen or t.has(ClearDedupe) else dedupe,
    )


#: `last_detail` of a claim whose lease ran out
LEASE_EXPIRED = "lease_expired"


def after_lease_expiry(item: WorkItem, open_attempt: bool, now: datetime) -> Transition:
    """An expired claim: due again when no attempt started, `unknown` when one was left open.

    An open attempt may have reached the provider, so the item is never put back to "not sent".
    """
    if open_attempt:
        return Transition(
            item.key,
            DeliveryState.CLAIMED,
            item.lease_token,
            DeliveryState.UNKNOWN,
            now,
            failure_class=FailureClass.UNKNOWN,
            detail=LEASE_EXPIRED,
        )
    return Transition(
        item.key,
        DeliveryState.CLAIMED,
        item.lease_token,
        DeliveryState.RETRY_SCHEDULED,
        now,
        next_attempt_at=now,
        detail=LEASE_EXPIRED,
    )


#: the audit actor of an item cancelled because its customer is on the suppression list
SUPPRESSION_ACTOR = "system:suppression"


def suppressible(item: WorkItem, started: bool) -> bool:
    """Whether a suppression cancels the item: no attempt of it may start any more.

    An unclaimed item, or a claimed one whose attempt has not started (`started`: the ledger
    holds an attempt under its current lease token). An attempt already started is in flight;
    its outcome is recorded as usual.
    """
    return item.state in CLAIMABLE or (item.state is DeliveryState.CLAIMED and not started)


def cancelled_by_suppression(
    item: WorkItem, now: datetime, reason: str, started: bool = False
) -> Transition:
    """An item of a suppressed customer whose attempt has not started, ended as `suppressed`.

    `reason` is the suppression's reason (`unsubscribed`, `hard_bounce`, …); the audit row
    says it, and `last_detail` reads `suppressed:<reason>` in the UI's tables. `started` is
    `suppressible`'s.
    """
    if not suppressible(item, started):
        raise LostRace(f"{item.key}: {item.state.value}; its attempt may have started")
    return Transition(
        item.key,
        item.state,
        item.lease_token,
        DeliveryState.SUPPRESSED,
        now,
        detail=f"suppressed:{reason}",
        audit=AuditNote(SUPPRESSION_ACTOR, "suppress", f"customer suppressed: {reason}"),
    )
