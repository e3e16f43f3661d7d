"""Eligibility: select active, opted-in customers for a period and freeze the selection once.

A re-run reuses the frozen selection without reading the source again, so a customer who turns
inactive (or opts in) after the freeze does not change the period. A customer on the suppression
list (unsubscribed, bounced, complained, or suppressed by an operator) is left out and counted;
one suppressed after the freeze stays in the frozen selection, and their item is cancelled
instead (`WorkQueue.cancel_suppressed`).

An eligible customer whose id cannot form an operation key, or whose address is longer than
MAX_ADDRESS_LENGTH, is left out and counted (`domain.model.exclusion`); `count_exclusions`
recounts them from the source for the WARN check and `digest status`.

Customers are selected by id, not by mailbox: three ids that share one address get three
digests, each its own content and unsubscribe link (README, "Decisions where the design was
silent").
"""

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from digest_pipeline.domain.model import Exclusion, SnapshotEntry, exclusion, is_eligible
from digest_pipeline.domain.periods import Period
from digest_pipeline.ports.ledger_roles import SnapshotStore
from digest_pipeline.ports.outside import Clock, CustomerSource
from digest_pipeline.services.executor import IN_TURN, Executor
from digest_pipeline.services.logs import step_log


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
    #: customers whose address is longer than MAX_ADDRESS_LENGTH; left out and counted
    long_addresses: int = 0
    #: eligible customers on the suppression list; left out and counted
    suppressed: int = 0


#: how many ids of customers with an over-long address an exclusion count names
SAMPLE_IDS = 10


@dataclass(frozen=True)
class ExclusionCount:
    """Eligible customers the snapshot leaves out, recounted from the source as it is now.

    Ids that are invalid are only counted: such an id may hold anything (control characters,
    an address), so it is never shown. Customers with an over-long address have valid ids, and a
    few of them are named (`long_address_ids`), never their addresses.
    """

    invalid_ids: int
    long_addresses: int
    long_address_ids: tuple[str, ...]

    @property
    def total(self) -> int:
        return self.invalid_ids + self.long_addresses


def count_exclusions(source: CustomerSource) -> ExclusionCount:
    """Streams the source once and counts the eligible customers `exclusion` leaves out."""
    invalid, long_count = 0, 0
    long_ids: list[str] = []
    for customer in source.customers():
        if not is_eligible(customer):
            continue
        why = exclusion(customer)
        if why is Exclusion.INVALID_ID:
            invalid += 1
        elif why is Exclusion.ADDRESS_TOO_LONG:
            long_count += 1
            if len(long_ids) < SAMPLE_IDS:
                long_ids.append(customer.customer_id)
    return ExclusionCount(invalid, long_count, tuple(long_ids))


def take_snapshot(
    source: CustomerSource,
    ledger: SnapshotStore,
    clock: Clock,
    period: Period,
    run_id: str,
    *,
    executor: Executor = IN_TURN,
) -> SnapshotReport:
    """Freezes the period's selection, or reports the one frozen before."""
    existing = ledger.snapshot(period)
    if existing is not None:
        step_log.info("snapshot_reused", period=period, eligible=existing.eligible_count)
        return SnapshotReport(
            period, True, existing.eligible_count, existing.selection_run_id, existing.selected_at
        )
    counts = {
        "considered": 0,
        "suppressed": 0,
        Exclusion.INVALID_ID: 0,
        Exclusion.ADDRESS_TOO_LONG: 0,
    }
    # read before the source: a suppression recorded while the source streams is caught by
    # the cancellation before delivery, never lost
    suppressed = ledger.suppressed_ids()

    def selected() -> Iterator[SnapshotEntry]:
        for customer in source.customers():
            counts["considered"] += 1
            if not is_eligible(customer):
                continue
            why = exclusion(customer)
            if why is not None:
                counts[why] += 1
                continue
            if customer.customer_id in suppressed:
                counts["suppressed"] += 1
                continue
            yield SnapshotEntry(customer.customer_id, customer.email)

    with executor.bulk():
        receipt = ledger.freeze_snapshot(period, run_id, clock.now(), selected())
    info = receipt.info
    step_log.info(
        "snapshot_reused" if receipt.reused else "snapshot_frozen",
        period=period,
        eligible=info.eligible_count,
        invalid_ids=counts[Exclusion.INVALID_ID],
        long_addresses=counts[Exclusion.ADDRESS_TOO_LONG],
        suppressed=counts["suppressed"],
    )
    return SnapshotReport(
        period,
        receipt.reused,
        info.eligible_count,
        info.selection_run_id,
        info.selected_at,
        counts["considered"],
        counts[Exclusion.INVALID_ID],
        counts[Exclusion.ADDRESS_TOO_LONG],
        counts["suppressed"],
    )
