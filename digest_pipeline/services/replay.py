"""Bounded, audited replay of dead-lettered or failed keys of one period.

The request is checked as a whole before anything changes: one period, at most `cap` keys, each
key known, of that period and replayable. Each key is then reconciled first (ledger, then mailer
lookup); a key with evidence of delivery is reported and left alone, never sent again.
"""

import logging
from dataclasses import dataclass
from enum import StrEnum

from digest_pipeline.domain.errors import LostRace, ReplayRefused
from digest_pipeline.domain.model import (
    AuditEntry,
    AuditNote,
    LookupStatus,
    Transition,
    WorkItem,
)
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.states import REPLAYABLE, DeliveryState
from digest_pipeline.ports import Clock, Ledger, Mailer
from digest_pipeline.services.evidence import confirmed_attempt
from digest_pipeline.services.logs import log_event

S = DeliveryState
#: the hard cap per request; raising it takes an explicit argument (and flag, in the CLI)
DEFAULT_REPLAY_CAP = 100


class ReplayPlan(StrEnum):
    """What replay does (or, in a dry run, would do) with one key."""

    #: reopened as `pending`, with a fresh retry budget, delivered by the next worker or sweep
    REPLAY = "replay"
    #: evidence says the digest was delivered; left as it is, not sent again
    ALREADY_DELIVERED = "already_delivered"
    #: someone else moved the item between the check and the replay; left to them
    CHANGED_MEANWHILE = "changed_meanwhile"


@dataclass(frozen=True)
class ReplayLine:
    key: OperationKey
    state: DeliveryState
    plan: ReplayPlan
    evidence: str


@dataclass(frozen=True)
class ReplayReport:
    period: Period
    dry_run: bool
    lines: tuple[ReplayLine, ...]

    @property
    def replayed(self) -> int:
        return sum(1 for line in self.lines if line.plan is ReplayPlan.REPLAY)


def _validate(ledger: Ledger, period: Period, keys: list[OperationKey], cap: int) -> list[WorkItem]:
    unique = list(dict.fromkeys(keys))
    if not unique:
        raise ReplayRefused("replay needs at least one key")
    if len(unique) > cap:
        raise ReplayRefused(f"{len(unique)} keys exceed the replay cap of {cap}; nothing replayed")
    problems, items = [], []
    for key in unique:
        if key.period != period:
            problems.append(f"{key} is not of period {period}")
            continue
        item = ledger.get(key)
        if item is None:
            problems.append(f"{key} is unknown")
        elif item.state not in REPLAYABLE:
            problems.append(f"{key} is {item.state.value}, not dead_lettered or failed")
        else:
            items.append(item)
    if problems:
        raise ReplayRefused("replay refused, nothing changed: " + "; ".join(problems))
    return items


def _plan(ledger: Ledger, mailer: Mailer, item: WorkItem) -> tuple[ReplayPlan, str]:
    if confirmed_attempt(ledger, item.key) is not None:
        return ReplayPlan.ALREADY_DELIVERED, "ledger_attempt"
    lookup = mailer.lookup(str(item.key))
    if lookup.status is LookupStatus.FOUND:
        return ReplayPlan.ALREADY_DELIVERED, "mailer_lookup_found"
    return ReplayPlan.REPLAY, f"mailer_lookup_{lookup.status.value}"


def replay_keys(
    ledger: Ledger,
    mailer: Mailer,
    clock: Clock,
    period: Period,
    keys: list[OperationKey],
    *,
    operator: str,
    reason: str,
    dry_run: bool,
    cap: int = DEFAULT_REPLAY_CAP,
) -> ReplayReport:
    """Replays the given keys of one period (or says what it would do, with `dry_run`)."""
    operator, reason = operator.strip(), reason.strip()
    if not operator or not reason:
        raise ReplayRefused("a replay needs an operator and a reason")
    items = _validate(ledger, period, keys, cap)
    # a raised cap is part of the decision, so the audit row says so
    why = reason if cap <= DEFAULT_REPLAY_CAP else f"{reason}; cap raised to {cap}"
    lines = []
    for item in items:
        plan, evidence = _plan(ledger, mailer, item)
        if dry_run:
            lines.append(ReplayLine(item.key, item.state, plan, evidence))
            continue
        now = clock.now()
        if plan is ReplayPlan.REPLAY:
            try:
                ledger.apply(
                    Transition(
                        item.key,
                        item.state,
                        item.lease_token,
                        S.PENDING,
                        now,
                        next_attempt_at=now,
                        detail="replayed",
                        reopen=True,
                        audit=AuditNote(operator, "replay", f"{why} ({evidence})"),
                    )
                )
            except LostRace as e:
                # Each key is its own transaction: report this one, keep the others' result.
                log_event("lost_race", logging.WARNING, key=item.key, step="replay", why=e)
                plan = ReplayPlan.CHANGED_MEANWHILE
        else:
            ledger.record_audit(
                AuditEntry(
                    now,
                    operator,
                    "replay_skipped",
                    item.key,
                    item.state,
                    item.state,
                    f"{why} (evidence:{evidence})",
                    period,
                )
            )
        lines.append(ReplayLine(item.key, item.state, plan, evidence))
        log_event("replay", key=item.key, plan=plan.value, evidence=evidence, operator=operator)
    return ReplayReport(period, dry_run, tuple(lines))
