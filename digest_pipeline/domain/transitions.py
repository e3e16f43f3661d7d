"""The work item's moves as pure functions: from an item, its evidence, the policy and `now`.

How a move is applied to an item, when an item is due or may be claimed, when an `unknown`
item's retention has run out and why the sweeper should run for it are each decided here once,
with no I/O and no clock. What one claim's delivery records is `domain.delivery`'s decision and
what evidence settles an `unknown` item `domain.reconciliation`'s, both made with `move`.
"""

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from digest_pipeline.domain.errors import LostRace, ResolveRefused
from digest_pipeline.domain.failures import FailureClass
from digest_pipeline.domain.model import (
    AuditNote,
    Claim,
    ClearDedupe,
    RefundBudget,
    Reopen,
    Transition,
    WorkItem,
)
from digest_pipeline.domain.states import CLAIMABLE, DeliveryState, check_transition


def move(claim: Claim, target: DeliveryState, now: datetime, **fields: Any) -> Transition:
    """A guarded move of a claimed item: applied only while it is still claimed with its token."""
    return Transition(claim.key, DeliveryState.CLAIMED, claim.token, target, now, **fields)


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
