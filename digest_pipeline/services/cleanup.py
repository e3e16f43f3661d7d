"""The cleanup gate: archive or delete the generated rows of `sent` items, once per key.

The domain gate decides first (LBYL); the ledger's cleanup transaction enforces the same rule
with its unique cleanup row and its `sent → cleaned` compare-and-set.
"""

import logging
from collections import Counter
from dataclasses import dataclass, field

from digest_pipeline.domain.errors import LostRace
from digest_pipeline.domain.gate import cleanup_gate
from digest_pipeline.domain.model import CleanupMode
from digest_pipeline.domain.periods import Period
from digest_pipeline.ports import Clock, Ledger
from digest_pipeline.services.logs import log_event


@dataclass
class CleanupReport:
    """What cleanup did, and why the gate held the other items back."""

    cleaned: int = 0
    already_cleaned: int = 0
    rows: int = 0
    lost_races: int = 0
    #: items the gate kept closed, by reason (e.g. `not_sent:unknown`)
    held_back: Counter[str] = field(default_factory=Counter)


def clean_period(ledger: Ledger, clock: Clock, period: Period, mode: CleanupMode) -> CleanupReport:
    """Cleans every `sent` item of the period; safe to run again at any time."""
    report = CleanupReport()
    for item in ledger.items(period):
        gate = cleanup_gate(item.state)
        if not gate.open:
            if gate.reason == "already_cleaned":
                report.already_cleaned += 1
            else:
                report.held_back[gate.reason] += 1
            continue
        try:
            receipt = ledger.clean(item.key, item.lease_token, mode, clock.now())
        except LostRace as e:
            report.lost_races += 1
            log_event("lost_race", logging.WARNING, key=item.key, step="cleanup", why=e)
            continue
        if receipt.status == "cleaned":
            report.cleaned += 1
            report.rows += receipt.rows
        else:
            report.already_cleaned += 1
        log_event("cleanup", key=item.key, status=receipt.status, rows=receipt.rows)
    return report
