"""What evidence settles a possibly delivered item: reconciliation's, a retry's, an event's.

Its own module because these decisions weigh evidence (the ledger's attempts, the mailer's
lookup, the provider's deduplication window or `delivered` event) rather than answer one event;
the moves they return are ordinary `domain.transitions` moves, so `apply` stores them alike.
"""

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from digest_pipeline.domain.errors import LostRace
from digest_pipeline.domain.failures import FailureClass
from digest_pipeline.domain.mailer_identity import foreign_mailers
from digest_pipeline.domain.model import (
    Attempt,
    AuditNote,
    ClearDedupe,
    LookupResult,
    LookupStatus,
    ResendUntil,
    Transition,
    WorkItem,
    WriteDeadLetter,
)
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.retry import DeadLetterReason
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.domain.transitions import unknown_expired


class Evidence(StrEnum):
    """What settled an `unknown` item, in the order reconciliation looks (design §2)."""

    #: the ledger holds an attempt the provider confirmed
    LEDGER_ATTEMPT = "ledger_attempt"
    #: every recorded attempt closed with an outcome that proves the provider did not take it
    LEDGER_ATTEMPTS_NOT_ACCEPTED = "ledger_attempts_not_accepted"
    MAILER_LOOKUP_FOUND = "mailer_lookup_found"
    MAILER_LOOKUP_NOT_FOUND = "mailer_lookup_not_found"
    #: the provider will deduplicate a resend of the key: safe to send again before then
    IDEMPOTENT_RESEND = "idempotent_resend"
    #: no evidence and the retention ran out
    UNKNOWN_UNRESOLVED = "unknown_unresolved"
    #: the provider's own signed `delivered` event for the message (`digest serve`)
    PROVIDER_EVENT = "provider_event"


#: recorded outcomes the mailers give only when the provider did not take the message
NOT_ACCEPTED = frozenset(
    {FailureClass.TRANSIENT.value, FailureClass.THROTTLED.value, FailureClass.PERMANENT.value}
)


def confirmed(history: Sequence[Attempt]) -> Attempt | None:
    """The latest attempt the provider confirmed, even one that lost its race."""
    accepted = [a for a in history if a.outcome == "sent"]
    return accepted[-1] if accepted else None


def never_accepted(history: Sequence[Attempt]) -> bool:
    """True when there are attempts and every one closed with an outcome that proves not sent.

    An item can be `unknown` with such a history: its lease ran out mid-send, then the slow
    attempt came back with a transient failure. Nothing left, so it is due again.
    """
    return bool(history) and all(a.outcome in NOT_ACCEPTED for a in history)


def settle_unknown(
    item: WorkItem,
    history: Sequence[Attempt],
    lookup: Callable[[], LookupResult],
    *,
    mailer: str,
    now: datetime,
    closes_at: datetime,
    idempotency_window: timedelta | None,
    policy: DeliveryPolicy,
    actor: str,
    lookup_lag: timedelta = timedelta(0),
) -> tuple[Transition, Evidence] | None:
    """The move the evidence supports for an `unknown` item, or None while there is none.

    `history` is the item's attempts; `lookup` asks the mailer and is called only when the
    ledger's evidence settles nothing (the one piece of I/O, injected like the clock).
    `mailer` is the identity of the mailer `lookup` asks and a resend would go through: when
    an attempt that may have delivered was made through another, neither its lookup nor its
    deduplication is evidence, and only the ledger's evidence or the retention moves the item.
    A lookup's "not found" counts only once the latest attempt is older than `lookup_lag`, the
    time the provider's search may take to see a message it accepted.
    """
    pid: str | None = None
    own = not foreign_mailers(history, mailer)
    due_now: dict[str, Any] = {"next_attempt_at": now, "effects": (ClearDedupe(),)}
    fields: dict[str, Any]
    if (attempt := confirmed(history)) is not None:
        target, evidence, fields = DeliveryState.SENT, Evidence.LEDGER_ATTEMPT, {}
        pid = attempt.provider_message_id
    elif never_accepted(history):
        target, evidence, fields = (
            DeliveryState.RETRY_SCHEDULED,
            Evidence.LEDGER_ATTEMPTS_NOT_ACCEPTED,
            due_now,
        )
    elif own and (found := lookup()).status is LookupStatus.FOUND:
        target, evidence, fields = DeliveryState.SENT, Evidence.MAILER_LOOKUP_FOUND, {}
        pid = found.provider_message_id
    elif (
        own
        and found.status is LookupStatus.NOT_FOUND
        and _settled_in_lookup(history, now, lookup_lag)
    ):
        target, evidence, fields = (
            DeliveryState.RETRY_SCHEDULED,
            Evidence.MAILER_LOOKUP_NOT_FOUND,
            due_now,
        )
    elif (
        own
        and (until := _deduplicated_until(item, now, closes_at, idempotency_window, policy))
        is not None
    ):
        target, evidence = DeliveryState.RETRY_SCHEDULED, Evidence.IDEMPOTENT_RESEND
        fields = {"next_attempt_at": now, "effects": (ResendUntil(until),)}
    elif unknown_expired(item, now, policy.unknown_retention):
        target, evidence = DeliveryState.DEAD_LETTERED, Evidence.UNKNOWN_UNRESOLVED
        fields = {"effects": (WriteDeadLetter(DeadLetterReason.UNKNOWN_UNRESOLVED.value),)}
    else:
        return None
    transition = Transition(
        item.key,
        DeliveryState.UNKNOWN,
        item.lease_token,
        target,
        now,
        provider_message_id=pid,
        **reconciled(evidence, actor),
        **fields,
    )
    return transition, evidence


def _settled_in_lookup(history: Sequence[Attempt], now: datetime, lag: timedelta) -> bool:
    """Whether every attempt started long enough ago for the provider's lookup to see it."""
    return all(a.started_at <= now - lag for a in history)


def delivered_per_provider(
    item: WorkItem, now: datetime, provider_message_id: str | None, actor: str
) -> Transition:
    """An `unknown` item settled as sent by the provider's `delivered` event for it.

    The provider saying it delivered the message is the strongest evidence there is; the move
    and its audit row (`reconcile`, `evidence:provider_event`) are what reconciliation records.
    """
    if item.state is not DeliveryState.UNKNOWN:
        raise LostRace(f"{item.key}: {item.state.value}; only unknown items are settled by events")
    return Transition(
        item.key,
        DeliveryState.UNKNOWN,
        item.lease_token,
        DeliveryState.SENT,
        now,
        provider_message_id=provider_message_id,
        **reconciled(Evidence.PROVIDER_EVENT, actor),
    )


def reconciled(evidence: "Evidence", actor: str) -> dict[str, Any]:
    """The detail and audit note of a move made on evidence (reconciliation's, or a retry's)."""
    return {
        "detail": f"reconciled:{evidence.value}",
        "audit": AuditNote(actor, "reconcile", f"evidence:{evidence.value}"),
    }


def _deduplicated_until(
    item: WorkItem,
    now: datetime,
    closes_at: datetime,
    window: timedelta | None,
    policy: DeliveryPolicy,
) -> datetime | None:
    """Until when the provider remembers the first send's key, if a resend now reaches it first.

    A lease of margin covers the time between this decision and the resend's attempt; the
    deliverer re-checks `dedupe_until` (`before_send`) before it sends.
    """
    first = item.first_attempt_at
    if window is None or first is None:
        return None
    still_deliverable = item.replayed_at is not None or now < closes_at
    return first + window if still_deliverable and now + policy.lease < first + window else None
