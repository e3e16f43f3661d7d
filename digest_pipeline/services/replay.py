"""Bounded, audited replay of dead-lettered or failed keys of one period.

The request is checked as a whole before anything changes: one period, at most `cap` keys, each
key known, of that period and replayable. Each key is then reconciled first (ledger, then the
mailer's lookup, asked only about attempts that mailer made); a key with evidence of delivery is
reported and left alone, never sent again. A key whose history holds an attempt that may have
delivered it (`unknown`, or abandoned mid-send) with no later evidence that it did not is a
*possible duplicate*: the provider's deduplication window may have passed, or the attempt went
through another mailer, so a replay may deliver a second copy. Such a request is refused as a
whole unless the operator accepts that explicitly, and the acceptance is audited
(`replay_possible_duplicate`).
"""

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Protocol

from digest_pipeline.domain.errors import LostRace, PossibleDuplicateRefused, ReplayRefused
from digest_pipeline.domain.mailer_identity import describe_needed, foreign_mailers
from digest_pipeline.domain.model import (
    Attempt,
    AuditEntry,
    AuditNote,
    LookupResult,
    LookupStatus,
    WorkItem,
)
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.possible_sends import unsettled_uncertain_attempts
from digest_pipeline.domain.states import REPLAYABLE, DeliveryState
from digest_pipeline.domain.transitions import replayed
from digest_pipeline.ports.ledger_roles import AuditTrail, ReadModel
from digest_pipeline.ports.outside import Clock, Mailer
from digest_pipeline.services.combined_roles import WorkLedger
from digest_pipeline.services.evidence import confirmed_attempt
from digest_pipeline.services.logs import item_log

#: the hard cap per request; raising it takes an explicit argument (and flag, in the CLI)
DEFAULT_REPLAY_CAP = 100


class ReplayLedger(WorkLedger, AuditTrail, Protocol):
    """The items and their history read, reopened by guarded transitions, and the audit rows."""


class ReplayPlan(StrEnum):
    """What replay does (or, in a dry run, would do) with one key."""

    #: reopened as `pending`, with a fresh retry budget, delivered by the next worker or sweep
    REPLAY = "replay"
    #: evidence says the digest was delivered; left as it is, not sent again
    ALREADY_DELIVERED = "already_delivered"
    #: someone else moved the item between the check and the replay; left to them
    CHANGED_MEANWHILE = "changed_meanwhile"
    #: an earlier attempt may have delivered it and nothing says it did not: reopened only when
    #: the operator accepts a possible second copy, otherwise the whole request is refused
    POSSIBLE_DUPLICATE = "possible_duplicate"


@dataclass(frozen=True)
class PossibleSend:
    """The latest attempt that may have delivered a key: what the operator is shown."""

    number: int
    #: `unknown`, or `open` for an attempt abandoned mid-send
    outcome: str
    started_at: datetime
    detail: str | None
    provider_message_id: str | None

    @classmethod
    def of(cls, a: Attempt) -> "PossibleSend":
        return cls(a.number, a.outcome or "open", a.started_at, a.detail, a.provider_message_id)

    def describe(self) -> str:
        """One line: `attempt 1 unknown (timeout_after_send) at …, provider message id -`."""
        detail = f" ({self.detail})" if self.detail else ""
        return (
            f"attempt {self.number} {self.outcome}{detail} at {self.started_at.isoformat()}, "
            f"provider message id {self.provider_message_id or '-'}"
        )


@dataclass(frozen=True)
class ReplayLine:
    key: OperationKey
    state: DeliveryState
    plan: ReplayPlan
    evidence: str
    #: for `possible_duplicate`: the attempt that may have delivered the key
    possible_send: PossibleSend | None = None


@dataclass(frozen=True)
class ReplayReport:
    period: Period
    dry_run: bool
    lines: tuple[ReplayLine, ...]
    #: the operator accepted that a possible duplicate may be delivered a second time
    accepted_possible_duplicate: bool = False

    @property
    def replayed(self) -> int:
        """Keys reopened (or, in a dry run, that would be with this request's flags)."""
        plans = {ReplayPlan.REPLAY}
        if self.accepted_possible_duplicate:
            plans.add(ReplayPlan.POSSIBLE_DUPLICATE)
        return sum(1 for line in self.lines if line.plan in plans)

    @property
    def possible_duplicates(self) -> tuple[OperationKey, ...]:
        return tuple(line.key for line in self.lines if line.plan is ReplayPlan.POSSIBLE_DUPLICATE)


def _validate(
    ledger: ReadModel, period: Period, keys: list[OperationKey], cap: int
) -> list[WorkItem]:
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


@dataclass(frozen=True)
class _Planned:
    item: WorkItem
    plan: ReplayPlan
    evidence: str
    possible_send: PossibleSend | None = None


def _plan(ledger: ReadModel, mailer: Mailer, item: WorkItem, audit: list[AuditEntry]) -> _Planned:
    history = ledger.attempts(item.key)
    if confirmed_attempt(ledger, item.key) is not None:
        return _Planned(item, ReplayPlan.ALREADY_DELIVERED, "ledger_attempt")
    if needed := foreign_mailers(history, mailer.identity):
        # this mailer's lookup says nothing of another's sends: no evidence either way
        lookup = LookupResult(LookupStatus.UNSUPPORTED)
        evidence = f"needs_mailer:{describe_needed(needed)}"
    else:
        lookup = mailer.lookup(str(item.key))
        evidence = f"mailer_lookup_{lookup.status.value}"
    if lookup.status is LookupStatus.FOUND:
        return _Planned(item, ReplayPlan.ALREADY_DELIVERED, "mailer_lookup_found")
    if lookup.status is LookupStatus.UNSUPPORTED and (
        uncertain := unsettled_uncertain_attempts(history, audit)
    ):
        # The provider may hold the first send and may no longer deduplicate its key.
        return _Planned(
            item, ReplayPlan.POSSIBLE_DUPLICATE, evidence, PossibleSend.of(uncertain[-1])
        )
    return _Planned(item, ReplayPlan.REPLAY, evidence)


def _refuse_possible_duplicates(planned: list[_Planned]) -> None:
    doubtful = [p for p in planned if p.plan is ReplayPlan.POSSIBLE_DUPLICATE]
    if doubtful:
        keys = ", ".join(str(p.item.key) for p in doubtful)
        raise PossibleDuplicateRefused(
            f"replay refused, nothing changed: {len(doubtful)} key(s) may already have been "
            f"delivered (an attempt may have reached the provider): {keys}; accept a possible "
            "second copy explicitly to replay them",
            tuple(str(p.item.key) for p in doubtful),
        )


def _act(ledger: ReplayLedger, clock: Clock, p: _Planned, operator: str, why: str) -> ReplayPlan:
    """Reopens one key as `pending` (its own transaction), or audits that it was left alone."""
    now, key = clock.now(), p.item.key
    plan = p.plan
    if plan is ReplayPlan.ALREADY_DELIVERED:
        ledger.record_audit(
            AuditEntry(
                now,
                operator,
                "replay_skipped",
                key,
                p.item.state,
                p.item.state,
                f"{why} (evidence:{p.evidence})",
                key.period,
            )
        )
    else:
        if p.possible_send is not None:
            action = "replay_possible_duplicate"
            note = f"{why} (operator accepted a possible duplicate: {p.possible_send.describe()})"
        else:
            action, note = "replay", f"{why} ({p.evidence})"
        try:
            ledger.apply(replayed(p.item, now, AuditNote(operator, action, note)))
        except LostRace as e:
            # Each key is its own transaction: report this one, keep the others' result.
            item_log.warning("lost_race", key=key, step="replay", why=e)
            plan = ReplayPlan.CHANGED_MEANWHILE
    item_log.info("replay", key=key, plan=plan.value, evidence=p.evidence, operator=operator)
    return plan


def replay_keys(
    ledger: ReplayLedger,
    mailer: Mailer,
    clock: Clock,
    period: Period,
    keys: list[OperationKey],
    *,
    operator: str,
    reason: str,
    dry_run: bool,
    cap: int = DEFAULT_REPLAY_CAP,
    accept_possible_duplicate: bool = False,
) -> ReplayReport:
    """Replays the given keys of one period (or says what it would do, with `dry_run`).

    Raises `PossibleDuplicateRefused` (nothing changed) when a key is a possible duplicate and
    `accept_possible_duplicate` is not given; a dry run reports such keys instead.
    """
    operator, reason = operator.strip(), reason.strip()
    if not operator or not reason:
        raise ReplayRefused("a replay needs an operator and a reason")
    items = _validate(ledger, period, keys, cap)
    # a raised cap is part of the decision, so the audit row says so
    why = reason if cap <= DEFAULT_REPLAY_CAP else f"{reason}; cap raised to {cap}"
    audit: dict[OperationKey, list[AuditEntry]] = {}
    for e in ledger.audit_log(period):
        if e.key is not None:
            audit.setdefault(e.key, []).append(e)
    # Every key is planned before any is changed, so a refusal leaves the whole request undone.
    planned = [_plan(ledger, mailer, item, audit.get(item.key, [])) for item in items]
    if not dry_run and not accept_possible_duplicate:
        _refuse_possible_duplicates(planned)
    lines = []
    for p in planned:
        plan = p.plan if dry_run else _act(ledger, clock, p, operator, why)
        lines.append(ReplayLine(p.item.key, p.item.state, plan, p.evidence, p.possible_send))
    return ReplayReport(period, dry_run, tuple(lines), accept_possible_duplicate)
