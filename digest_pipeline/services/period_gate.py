"""The period gates: a missed week and a changed snapshot stop a period's work before it starts.

A week whose window closed unattempted is refused (`refusal`) unless an operator granted it a late
window, an audit row (`deliver_late`), so the ledger alone says which weeks were sent late, by whom
and why. Nothing of a period whose frozen snapshot changed after the freeze is sent or cleaned
(`snapshot_refusal`). A delivery worker reads both once a lease (`facts`).
"""

from datetime import datetime

from digest_pipeline.domain.delivery import PeriodFacts
from digest_pipeline.domain.errors import LateWeekRefused, SnapshotTampered
from digest_pipeline.domain.model import AuditEntry
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.ports.ledger_roles import AuditTrail, ReadModel
from digest_pipeline.services.combined_roles import PeriodReader
from digest_pipeline.services.logs import step_log

#: the audit action of an operator's late-delivery grant
LATE_ACTION = "deliver_late"
#: the clause of `DeliveryPolicy.late_refusal`'s line that `refusal` replaces with what the
#: ledger holds of the period, so the line is true whoever refuses, and whenever
NOTHING_RECORDED = "nothing was recorded"
#: the ledger's own invariant that the snapshot gate asks for (design §4, invariant 5)
SNAPSHOT_UNCHANGED = "snapshot_unchanged"


def late_since(ledger: ReadModel, period: Period) -> datetime | None:
    """When an operator last granted the period a late window, or None."""
    grants = [e.at for e in ledger.audit_log(period) if e.action == LATE_ACTION]
    return max(grants, default=None)


def closes_at(ledger: ReadModel, policy: DeliveryPolicy, period: Period) -> datetime:
    """The period's delivery window close, a late grant included."""
    return policy.closes_at(period, late_since(ledger, period))


def facts(ledger: ReadModel, policy: DeliveryPolicy, period: Period, now: datetime) -> PeriodFacts:
    """The period's window close (late grant included) and snapshot verdict, read at `now`.

    The snapshot check fingerprints the whole snapshot (on PostgreSQL, after a ledger's first,
    it counts the rows' writer instead: `adapters/sql/invariants.Seal`), so a delivery worker
    keeps these for a lease (`Deliverer.facts`).
    """
    return PeriodFacts(
        now, closes_at(ledger, policy, period), snapshot_refusal(ledger, period, now)
    )


def refusal(
    ledger: PeriodReader, policy: DeliveryPolicy, period: Period, now: datetime
) -> str | None:
    """The one-line reason a run of the period must not start now, or None.

    The line says what the ledger already holds of the period: a step that refuses after
    earlier steps froze the snapshot and enqueued the items (the window closed during the run)
    must not claim that nothing was recorded.
    """
    # An open window needs no reads beyond the clock: the common case costs nothing.
    if now < policy.closes_at(period):
        return None
    attempted = bool(ledger.attempt_outcome_counts(period))
    why = policy.late_refusal(period, now, attempted, late_since(ledger, period))
    if why is None:
        return None
    return why.replace(NOTHING_RECORDED, recorded(ledger, period), 1)


def recorded(ledger: PeriodReader, period: Period) -> str:
    """What the ledger holds of a period no digest of which was attempted, as a clause."""
    snapshot = ledger.snapshot(period)
    items = sum(ledger.state_counts(period).values())
    if snapshot is None and not items:
        return NOTHING_RECORDED
    held = []
    if snapshot is not None:
        eligible = snapshot.eligible_count
        held.append(f"its snapshot ({eligible} customer{'s' if eligible != 1 else ''})")
    if items:
        held.append(f"{items} work item{'s' if items != 1 else ''}")
    verb = "is" if len(held) == 1 and items <= 1 else "are"
    return f"{' and '.join(held)} {verb} recorded and kept, but no digest was sent"


def grant_refusal(policy: DeliveryPolicy, period: Period, now: datetime) -> str | None:
    """Why a late grant must not be recorded now (the normal window is still open), or None."""
    normal = policy.closes_at(period)
    if now < normal:
        return (
            f"period {period}: its delivery window is open until {normal:%Y-%m-%d %H:%M} UTC;"
            " --deliver-late is not needed"
        )
    return None


def require_deliverable(
    ledger: PeriodReader, policy: DeliveryPolicy, period: Period, now: datetime
) -> None:
    """Raises LateWeekRefused for a missed week; its line says what the ledger holds of it."""
    if (why := refusal(ledger, policy, period, now)) is not None:
        step_log.info("late_week_refused", period=period)
        raise LateWeekRefused(why)


def grant_late_delivery(
    ledger: AuditTrail,
    policy: DeliveryPolicy,
    period: Period,
    now: datetime,
    operator: str,
    reason: str,
) -> datetime:
    """Records an operator's grant to deliver a missed week late; returns the new close.

    Refused (LateWeekRefused, nothing recorded) while the normal window is still open: a grant
    there would only lengthen a window nobody asked to lengthen.
    """
    if not operator.strip() or not reason.strip():
        raise LateWeekRefused("a late delivery needs an operator and a reason")
    if (why := grant_refusal(policy, period, now)) is not None:
        raise LateWeekRefused(why)
    ledger.record_audit(
        AuditEntry(now, operator, LATE_ACTION, None, None, None, reason.strip(), period)
    )
    closes = policy.closes_at(period, now)
    step_log.info("late_delivery_granted", period=period, operator=operator)
    return closes


def snapshot_line(period: Period) -> str:
    """The one line a tampered period is refused with: the period, never an address."""
    return (
        f"period {period}: its frozen eligibility snapshot no longer matches the fingerprint "
        f"taken at the freeze (snapshot_unchanged); nothing of it is sent or cleaned until the "
        f"snapshot is restored (digest status --period {period})"
    )


def snapshot_refusal(ledger: ReadModel, period: Period, now: datetime) -> str | None:
    """The refusal line of a period whose snapshot changed after the freeze, or None.

    Design §4's invariant 5 is an asset check, but an asset check runs only when the whole graph
    does; the sweep, the sensor's delivery-and-cleanup runs, the simulator and every worker ask
    the ledger's own `snapshot_unchanged` check here first.
    """
    [result] = ledger.check_invariants(period, now, names={SNAPSHOT_UNCHANGED})
    if result.passed:
        return None
    step_log.info("snapshot_tampered", period=period)
    return snapshot_line(period)


def require_unchanged_snapshot(ledger: ReadModel, period: Period, now: datetime) -> None:
    """Raises SnapshotTampered (before anything is changed) for a tampered period."""
    if (why := snapshot_refusal(ledger, period, now)) is not None:
        raise SnapshotTampered(why, str(period))
