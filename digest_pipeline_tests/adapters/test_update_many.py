"""`update_many` on both backends: each row's own values through its column's type, a shared
expression, the rows matched, and a row of the wrong width refused before anything is written."""

from datetime import timedelta

import pytest
from sqlalchemy import insert, select

from digest_pipeline.adapters.sql.bulk import update_many
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.adapters.sql.schema import period_runs
from digest_pipeline_tests.conftest import T0

PERIODS = ("2026-W40", "2026-W41", "2026-W42")
#: one expression for every row (a module constant, as update_many's callers pass them)
BUMP = period_runs.c.eligible_count + 10


def seeded(ledger: SqlLedger) -> None:
    with ledger.engine.begin() as conn:
        conn.execute(
            insert(period_runs),
            [
                {
                    "period": p,
                    "selection_run_id": "run",
                    "selected_at": T0,
                    "eligible_count": 1,
                    "fingerprint": "f",
                }
                for p in PERIODS
            ],
        )


def state(ledger: SqlLedger) -> dict[str, tuple[object, ...]]:
    with ledger.engine.connect() as conn:
        rows = conn.execute(
            select(
                period_runs.c.period, period_runs.c.eligible_count, period_runs.c.enqueued_at
            ).order_by(period_runs.c.period)
        )
        return {p: (n, at) for p, n, at in rows}


def test_each_row_gets_its_own_values_and_the_shared_expression(sql_ledger: SqlLedger) -> None:
    seeded(sql_ledger)
    later = T0 + timedelta(hours=1)
    rows = [(("2026-W40",), {"enqueued_at": later}), (("2026-W42",), {"enqueued_at": T0})]
    with sql_ledger.engine.begin() as conn:
        matched = update_many(
            conn, period_runs, ("period",), {"enqueued_at": None, "eligible_count": BUMP}, rows
        )
        # a key that matches nothing counts nothing
        missed = update_many(
            conn,
            period_runs,
            ("period",),
            {"enqueued_at": None},
            [(("2026-W01",), {"enqueued_at": T0})],
        )

    assert (matched, missed) == (2, 0)
    assert state(sql_ledger) == {
        "2026-W40": (11, later),
        "2026-W41": (1, None),
        "2026-W42": (11, T0),
    }


def test_a_row_of_the_wrong_width_writes_nothing(sql_ledger: SqlLedger) -> None:
    seeded(sql_ledger)
    rows = [(("2026-W40",), {"enqueued_at": T0}), (("2026-W41", "x"), {"enqueued_at": T0})]

    # the caller's transaction goes on and commits: nothing of the call may be in it
    with sql_ledger.engine.begin() as conn, pytest.raises(ValueError, match="matches on 1 values"):
        update_many(conn, period_runs, ("period",), {"enqueued_at": None}, rows)

    assert state(sql_ledger) == {p: (1, None) for p in PERIODS}


def test_a_row_whose_unset_column_is_already_set_is_not_matched(sql_ledger: SqlLedger) -> None:
    seeded(sql_ledger)
    with sql_ledger.engine.begin() as conn:
        # W41 was enqueued already: the guard keeps its first time
        update_many(
            conn,
            period_runs,
            ("period",),
            {"enqueued_at": None},
            [(("2026-W41",), {"enqueued_at": T0})],
        )
        later = T0 + timedelta(hours=1)
        matched = update_many(
            conn,
            period_runs,
            ("period",),
            {"enqueued_at": None},
            [((p,), {"enqueued_at": later}) for p in PERIODS],
            unset=("enqueued_at",),
        )

    assert matched == 2
    assert state(sql_ledger) == {
        "2026-W40": (1, later),
        "2026-W41": (1, T0),
        "2026-W42": (1, later),
    }
