"""The cleanup gate: archive or delete the generated rows of `sent` items, once per key.

The domain gate decides first (LBYL); the ledger's cleanup transaction enforces the same rule
with its unique cleanup row and its `sent → cleaned` compare-and-set. Before either, the period's
frozen snapshot must still match its fingerprint: a tampered period keeps every row (its rows are
the evidence of what was selected and sent).
"""

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

from digest_pipeline.domain.chunks import chunked
from digest_pipeline.domain.errors import DigestError, LostRace
from digest_pipeline.domain.gate import cleanup_gate
from digest_pipeline.domain.model import CleanupMode, CleanupReceipt, ItemLease
from digest_pipeline.domain.periods import Period
from digest_pipeline.ports.ledger_roles import Cleaner, ReadModel
from digest_pipeline.ports.outside import Clock
from digest_pipeline.services.executor import IN_TURN, Executor
from digest_pipeline.services.logs import item_log, step_log
from digest_pipeline.services.period_gate import require_unchanged_snapshot


class CleanupLedger(Cleaner, ReadModel, Protocol):
    """The items' states and tokens read, and their rows cleaned once per key."""


#: pages whose transactions run at once over a database server: one page's statements run
#: while this process prepares the next; more pages gain little
IN_FLIGHT = 2


@dataclass
class CleanupReport:
    """What cleanup did, and why the gate held the other items back."""

    cleaned: int = 0
    already_cleaned: int = 0
    rows: int = 0
    lost_races: int = 0
    #: items the gate kept closed, by reason (e.g. `not_sent:unknown`)
    held_back: Counter[str] = field(default_factory=Counter)


def clean_period(
    ledger: CleanupLedger,
    clock: Clock,
    period: Period,
    mode: CleanupMode,
    *,
    page: int = 500,
    in_flight: int = IN_FLIGHT,
    executor: Executor = IN_TURN,
) -> CleanupReport:
    """Cleans every `sent` item of the period, `page` items a transaction; safe to run again.

    With the runtime's executor over a database server, up to `in_flight` pages' transactions
    run at once on their own threads while this one reads and gates the next page: a page's
    transaction is mostly the server's work (moving rows, a new version of each item in every
    index), the reading and gating mostly this process's, so they overlap. Pages hold disjoint
    keys, and each transaction locks its own items first, so the once-per-key rule holds as it
    does for cleaners in different processes. On SQLite (or `IN_TURN`) each page's transaction
    is waited for before the next page is read.

    Raises:
        SnapshotTampered: the period's frozen snapshot changed after the freeze; nothing was
            cleaned.
        ValueError: `page` or `in_flight` is below 1.
    """
    if page < 1:
        raise ValueError("page must be at least 1")
    require_unchanged_snapshot(ledger, period, clock.now())
    report = CleanupReport()
    with (
        executor.bulk(),
        executor.writes(in_flight, "cleanup") as writes,
    ):
        # The gate decides item by item (a page at a time); the ledger then cleans the page's
        # open items in one transaction and enforces the same rule itself.
        for page_items in chunked(ledger.iter_item_leases(period, page=page), page):
            chosen = _gated(page_items, report)
            if chosen:
                keys = [(item.key, item.lease_token) for item in chosen]
                tally = partial(_tally, report, chosen)
                writes.submit(tally, ledger.clean_many, keys, mode, clock.now())
    step_log.info(
        "cleaned",
        period=period,
        cleaned=report.cleaned,
        rows=report.rows,
        already_cleaned=report.already_cleaned,
        held_back=report.held_back.total(),
        lost_races=report.lost_races,
    )
    return report


def _gated(items: Sequence[ItemLease], report: CleanupReport) -> list[ItemLease]:
    """The page's items the gate lets through; the others counted on `report` by reason."""
    chosen = []
    for item in items:
        gate = cleanup_gate(item.state)
        if gate.open:
            chosen.append(item)
        elif gate.reason == "already_cleaned":
            report.already_cleaned += 1
        else:
            report.held_back[gate.reason] += 1
    return chosen


def _tally(
    report: CleanupReport,
    chosen: Sequence[ItemLease],
    receipts: Sequence[CleanupReceipt | DigestError],
) -> None:
    """Counts one page's receipts; raises a non-race error."""
    for item, receipt in zip(chosen, receipts, strict=True):
        if isinstance(receipt, LostRace):
            report.lost_races += 1
            item_log.warning("lost_race", key=item.key, step="cleanup", why=receipt)
        elif isinstance(receipt, DigestError):
            raise receipt
        elif receipt.status == "cleaned":
            report.cleaned += 1
            report.rows += receipt.rows
            item_log.debug("cleanup", key=item.key, status="cleaned", rows=receipt.rows)
        else:
            report.already_cleaned += 1
            item_log.info("cleanup", key=item.key, status=receipt.status)
