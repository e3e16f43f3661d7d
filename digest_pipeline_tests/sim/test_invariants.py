"""The invariants come from `Ledger.check_invariants`, the code the asset checks and `digest
status` run, and the harness can fail: a ledger broken on purpose is caught."""

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import delete, insert, update

from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.adapters.sql.schema import cleanups, digest_rows, work_items
from digest_pipeline.domain.gate import GateDecision
from digest_pipeline.domain.model import (
    INVARIANTS,
    CleanupMode,
    CleanupReceipt,
    InvariantResult,
)
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.rigs.sim.grid import run_grid
from digest_pipeline.services import cleanup
from digest_pipeline_tests.sim.conftest import N, config, row_of, simulate


class CountingLedger(SqlLedger):
    """The real ledger, remembering what its invariant check answered."""

    answers: list[list[InvariantResult]]

    def check_invariants(self, period: Period, now: datetime, names=None):
        answer = super().check_invariants(period, now, names)
        if names is None:  # the full report; the snapshot gate's own calls ask for one invariant
            self.answers.append(answer)
        return answer


class CleanupBeforeSentLedger(SqlLedger):
    """Test-only and broken: cleanup claims its row and removes the content whatever the item's
    state (the real one requires `sent` and the token, in the same transaction)."""

    def clean_many(self, items, mode: CleanupMode, now: datetime):
        return [self._clean_anyway(key, mode, now) for key, _ in items]

    def _clean_anyway(self, key: OperationKey, mode: CleanupMode, now: datetime):
        k = str(key)
        with self.engine.begin() as conn:
            if conn.execute(cleanups.select().where(cleanups.c.operation_key == k)).first():
                return CleanupReceipt(key, "already_cleaned", 0)
            conn.execute(
                insert(cleanups).values(
                    operation_key=k,
                    period=str(key.period),
                    mode=mode.value,
                    rows=0,
                    claimed_at=now,
                    completed_at=now,
                )
            )
            conn.execute(
                update(work_items)
                .where(work_items.c.operation_key == k)
                .values(state=DeliveryState.CLEANED.value, cleaned_at=now, updated_at=now)
            )
            rows = conn.execute(delete(digest_rows).where(digest_rows.c.operation_key == k))
        return CleanupReceipt(key, "cleaned", rows.rowcount)


#: permanent failures and a sweep every 5 s: when cleanup runs, some items are `failed` and some
#: not yet sent, so a gate that opens before `sent` has something to clean
EXPOSED = replace(config(permanent_rate=0.05), sweep_interval=timedelta(seconds=5))


@pytest.fixture
def gate_open_before_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cleanup service's gate, opened for every state (the bug being simulated)."""
    monkeypatch.setattr(cleanup, "cleanup_gate", lambda state: GateDecision(True, "broken"))


def test_the_report_carries_every_invariant_the_ledger_answered():
    answers: list[list[InvariantResult]] = []

    def ledger(engine):
        counting = CountingLedger(engine)
        counting.answers = answers
        return counting

    result = simulate(config(), ledger_factory=ledger)
    assert [r.name for r in result.invariants] == list(INVARIANTS)
    assert answers == [list(result.invariants)]
    assert [c for c in result.row if c.startswith("inv_")] == [f"inv_{n}" for n in INVARIANTS]
    assert all(result.row[f"inv_{n}"] for n in INVARIANTS)


def test_a_cleanup_allowed_before_sent_is_caught_as_a_failed_invariant(gate_open_before_sent):
    result = simulate(EXPOSED, ledger_factory=CleanupBeforeSentLedger)
    row: dict[str, Any] = result.row
    assert not result.ok
    assert row["inv_at_most_one_cleanup_per_key"] is False
    assert row["invariants_ok"] is False
    assert row["invariant_failures"].startswith("at_most_one_cleanup_per_key:")
    assert row["keys_never_delivered"] > 0  # their rows were gone before they were sent
    assert row["cleaned"] == N


def test_a_broken_configuration_fails_the_grid(gate_open_before_sent):
    grid = run_grid(EXPOSED, ledger_factory=CleanupBeforeSentLedger)
    assert not grid.ok
    assert not grid.frame["invariants_ok"].any()


def test_with_only_the_gate_broken_the_ledgers_own_guard_still_holds(gate_open_before_sent):
    row = row_of(EXPOSED)
    assert row["invariants_ok"]
    assert row["lost_races"] > 0  # each premature cleanup was refused by the ledger
    assert row["cleaned"] + row["failed"] == row["keys_delivered"] + row["failed"] == N
