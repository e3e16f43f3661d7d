"""Reconciliation of `unknown` items, in design §2's order: ledger evidence, then the mailer.

An item is moved only on evidence: a confirmed attempt in the ledger, a history of attempts that
all closed as not accepted, the mailer's lookup, or a provider that will deduplicate a resend inside its idempotency window. Without evidence it stays
`unknown` (visible, rows kept) until its retention runs out and it is dead-lettered.
"""

import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from digest_pipeline.domain.errors import LostRace
from digest_pipeline.domain.model import AuditNote, LookupStatus, Transition, WorkItem
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.retry import DeadLetterReason
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.domain.transitions import unknown_expired
from digest_pipeline.ports import Clock, Ledger, Mailer
from digest_pipeline.services import late
from digest_pipeline.services.evidence import RECONCILE_ACTOR, confirmed_attempt, never_accepted
from digest_pipeline.services.logs import log_event

ACTOR = RECONCILE_ACTOR


@dataclass
class ReconcileReport:
    """How the period's `unknown` items were settled, by the state they moved to."""

    examined: int = 0
    moved: Counter[str] = field(default_factory=Counter)
    #: evidence used, e.g. `ledger_attempt`, `mailer_lookup_found`, `idempotent_resend`
    evidence: Counter[str] = field(default_factory=Counter)
    still_unknown: int = 0
    lost_races: int = 0
    #: every move made, as (operation key, new state, evidence), for the operator's terminal
    changes: list[tuple[OperationKey, DeliveryState, str]] = field(default_factory=list)


def _evidence(
    ledger: Ledger,
    mailer: Mailer,
    policy: DeliveryPolicy,
    item: WorkItem,
    now: datetime,
    closes_at: datetime,
) -> tuple[DeliveryState, str, dict[str, Any]] | None:
    """The move the evidence supports, as (target, evidence, extra transition fields)."""
    if (confirmed := confirmed_attempt(ledger, item.key)) is not None:
        pid = confirmed.provider_message_id
        return DeliveryState.SENT, "ledger_attempt", {"provider_message_id": pid}
    if never_accepted(ledger, item.key):
        fields = {"next_attempt_at": now, "clear_dedupe": True}
        return DeliveryState.RETRY_SCHEDULED, "ledger_attempts_not_accepted", fields
    found = mailer.lookup(str(item.key))
    if found.status is LookupStatus.FOUND:
        return (
            DeliveryState.SENT,
            "mailer_lookup_found",
            {"provider_message_id": found.provider_message_id},
        )
    if found.status is LookupStatus.NOT_FOUND:
        fields = {"next_attempt_at": now, "clear_dedupe": True}
        return DeliveryState.RETRY_SCHEDULED, "mailer_lookup_not_found", fields
    window = mailer.capabilities.idempotency_window
    first = item.first_attempt_at
    still_deliverable = item.replayed_at is not None or now < closes_at
    # The resend must reach the provider while it still remembers the first send's key; a lease
    # of margin covers the time between this decision and the resend's attempt, and the
    # deliverer re-checks `dedupe_until` before it sends.
    if (
        window is not None
        and first is not None
        and still_deliverable
        and now + policy.lease < first + window
    ):
        fields = {"next_attempt_at": now, "dedupe_until": first + window}
        return DeliveryState.RETRY_SCHEDULED, "idempotent_resend", fields
    if unknown_expired(item, now, policy.unknown_retention):
        reason = DeadLetterReason.UNKNOWN_UNRESOLVED.value
        return DeliveryState.DEAD_LETTERED, reason, {"dead_letter_reason": reason}
    return None


def reconcile_period(
    ledger: Ledger, mailer: Mailer, clock: Clock, policy: DeliveryPolicy, period: Period
) -> ReconcileReport:
    """Settles what evidence allows among the period's `unknown` items."""
    report = ReconcileReport()
    unknown = ledger.items(period, [DeliveryState.UNKNOWN])
    closes = late.closes_at(ledger, policy, period) if unknown else period.ends_at
    for item in unknown:
        report.examined += 1
        now = clock.now()
        found = _evidence(ledger, mailer, policy, item, now, closes)
        if found is None:
            report.still_unknown += 1
            continue
        target, evidence, fields = found
        try:
            ledger.apply(
                Transition(
                    item.key,
                    DeliveryState.UNKNOWN,
                    item.lease_token,
                    target,
                    now,
                    detail=f"reconciled:{evidence}",
                    audit=AuditNote(ACTOR, "reconcile", f"evidence:{evidence}"),
                    **fields,
                )
            )
        except LostRace as e:
            report.lost_races += 1
            log_event("lost_race", logging.WARNING, key=item.key, step="reconcile", why=e)
            continue
        report.moved[target.value] += 1
        report.evidence[evidence] += 1
        report.changes.append((item.key, target, evidence))
        log_event("reconciled", key=item.key, state=target.value, evidence=evidence)
    return report
