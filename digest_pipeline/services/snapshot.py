"""Eligibility: select active, opted-in customers for a period and freeze the selection once.

A re-run reuses the frozen selection without reading the source again, so a customer who turns
inactive (or opts in) after the freeze does not change the period.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from digest_pipeline.domain.errors import InvalidCustomerId
from digest_pipeline.domain.model import SnapshotEntry, is_eligible
from digest_pipeline.domain.periods import Period, validate_customer_id
from digest_pipeline.ports import Clock, CustomerSource, Ledger
from digest_pipeline.services.logs import log_event


@dataclass(frozen=True)
class SnapshotReport:
    period: Period
    reused: bool
    eligible: int
    selection_run_id: str
    selected_at: datetime
    #: customers read from the source (0 when the snapshot was reused)
    considered: int = 0
    #: customers whose id cannot form an operation key; left out and counted, never guessed at
    invalid_ids: int = 0


def take_snapshot(
    source: CustomerSource, ledger: Ledger, clock: Clock, period: Period, run_id: str
) -> SnapshotReport:
    """Freezes the period's selection, or reports the one frozen before."""
    existing = ledger.snapshot(period)
    if existing is not None:
        log_event("snapshot_reused", period=period, eligible=existing.eligible_count)
        return SnapshotReport(
            period, True, existing.eligible_count, existing.selection_run_id, existing.selected_at
        )
    counts = {"considered": 0, "invalid": 0}

    def selected() -> Iterator[SnapshotEntry]:
        for customer in source.customers():
            counts["considered"] += 1
            if not is_eligible(customer):
                continue
            try:
                validate_customer_id(customer.customer_id)
            except InvalidCustomerId:
                counts["invalid"] += 1
                continue
            yield SnapshotEntry(customer.customer_id, customer.email)

    receipt = ledger.freeze_snapshot(period, run_id, clock.now(), selected())
    info = receipt.info
    log_event(
        "snapshot_reused" if receipt.reused else "snapshot_frozen",
        period=period,
        eligible=info.eligible_count,
        invalid_ids=counts["invalid"],
    )
    return SnapshotReport(
        period,
        receipt.reused,
        info.eligible_count,
        info.selection_run_id,
        info.selected_at,
        counts["considered"],
        counts["invalid"],
    )
