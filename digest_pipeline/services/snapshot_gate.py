"""The snapshot gate: nothing of a period is sent or cleaned once its frozen snapshot changed.

Design §4's invariant 5 is an asset check, but an asset check runs only when the whole graph does;
the sweep, the sensor's delivery-and-cleanup runs, the simulator and any worker ask the ledger's
own `snapshot_unchanged` check here first. It fingerprints the whole snapshot, a cost that grows
with the period, so delivery workers cache the answer (`Deliverer.facts`);
on PostgreSQL a ledger that fingerprinted a period once confirms it by counting its rows' writer
(`adapters/sql/invariants.Seal`).
"""

from datetime import datetime

from digest_pipeline.domain.errors import SnapshotTampered
from digest_pipeline.domain.periods import Period
from digest_pipeline.ports.ledger_roles import ReadModel
from digest_pipeline.services.logs import log_event

SNAPSHOT_UNCHANGED = "snapshot_unchanged"


def refusal_line(period: Period) -> str:
    """The one line a tampered period is refused with: the period, never an address."""
    return (
        f"period {period}: its frozen eligibility snapshot no longer matches the fingerprint "
        f"taken at the freeze (snapshot_unchanged); nothing of it is sent or cleaned until the "
        f"snapshot is restored (digest status --period {period})"
    )


def snapshot_refusal(ledger: ReadModel, period: Period, now: datetime) -> str | None:
    """The refusal line of a period whose snapshot changed after the freeze, or None."""
    [result] = ledger.check_invariants(period, now, names={SNAPSHOT_UNCHANGED})
    if result.passed:
        return None
    log_event("snapshot_tampered", period=period)
    return refusal_line(period)


def require_unchanged_snapshot(ledger: ReadModel, period: Period, now: datetime) -> None:
    """Raises SnapshotTampered (before anything is changed) for a tampered period."""
    if (why := snapshot_refusal(ledger, period, now)) is not None:
        raise SnapshotTampered(why, str(period))
