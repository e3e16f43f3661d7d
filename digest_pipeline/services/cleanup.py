"""The cleanup gate: archive or delete the generated rows of `sent` items, once per key.

The domain gate decides first (LBYL); the ledger's cleanup transaction enforces the same rule
with its unique cleanup row and its `sent → cleaned` compare-and-set. Before either, the period's
frozen snapshot must still match its fingerprint: a tampered period keeps every row (its rows are
the evidence of what was selected and sent).
"""

import logging
from collections import Counter
from dataclasses import dataclass, field

from digest_pipeline.domain.chunks import chunked
from digest_pipeline.domain.errors import DigestError, LostRace
from digest_pipeline.domain.gate import cleanup_gate
from digest_pipeline.domain.model import CleanupMode
from digest_pipeline.domain.periods import Period
from digest_pipeline.ports import Clock, Ledger
from digest_pipeline.services.logs import log_event
from digest_pipeline.services.snapshot_gate import require_unchanged_snapshot


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
    ledger: Ledger, clock: Clock, period: Period, mode: CleanupMode, *, page: int = 500
) -> CleanupReport:
    """Cleans every `sent` item of the period, `page` items a transaction; safe to run again.

    Raises:
        SnapshotTampered: the period's frozen snapshot changed after the freeze; nothing was
            cleaned.
    """
    require_unchanged_snapshot(ledger, period, clock.now())
    report = CleanupReport()
    # The gate decides item by item (a page at a time); the ledger then cleans the page's
    # open items in one transaction and enforces the same rule itself.
    items = ledger.iter_item_leases(period, page=page)
    for page_items in chunked(items, page):
        chosen = []
        for item in page_items:
            gate = cleanup_gate(item.state)
            if gate.open:
                chosen.append(item)
            elif gate.reason == "already_cleaned":
                report.already_cleaned += 1
            else:
                report.held_back[gate.reason] += 1
        if not chosen:
            continue
        receipts = ledger.clean_many(
            [(item.key, item.lease_token) for item in chosen], mode, clock.now()
        )
        for item, receipt in zip(chosen, receipts, strict=True):
            if isinstance(receipt, LostRace):
                report.lost_races += 1
                log_event("lost_race", logging.WARNING, key=item.key, step="cleanup", why=receipt)
            elif isinstance(receipt, DigestError):
                raise receipt
            elif receipt.status == "cleaned":
                report.cleaned += 1
                report.rows += receipt.rows
                log_event(
                    "cleanup", logging.DEBUG, key=item.key, status="cleaned", rows=receipt.rows
                )
            else:
                report.already_cleaned += 1
                log_event("cleanup", key=item.key, status=receipt.status)
    log_event(
        "cleaned",
        period=period,
        cleaned=report.cleaned,
        rows=report.rows,
        already_cleaned=report.already_cleaned,
        held_back=report.held_back.total(),
        lost_races=report.lost_races,
    )
    return report
