"""SQLite's planner statistics of work items: read at a ledger's first large enqueue, then again
only as the table doubles, so a year of weeks does not make every enqueue read the whole table."""

import pytest
from sqlalchemy import func, select, text

from digest_pipeline.adapters.sql import base, queue
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.adapters.sql.schema import work_items
from digest_pipeline.domain.periods import Period
from digest_pipeline_tests.builders import seed_period

#: a small floor, so a week of a few customers counts as a large enqueue
FLOOR = 10
CUSTOMERS = 20
WEEKS = [Period.parse(f"2026-W{n:02d}") for n in range(10, 16)]


def analysed_rows(ledger: SqlLedger) -> int | None:
    """The table's row count as its last analysis saw it (None: never analysed)."""
    with ledger.engine.connect() as conn:
        if not conn.exec_driver_sql(
            "SELECT 1 FROM sqlite_master WHERE name='sqlite_stat1'"
        ).first():
            return None
        q = text("SELECT max(CAST(stat AS INTEGER)) FROM sqlite_stat1 WHERE tbl = 'work_items'")
        return conn.execute(q).scalar()


def rows(ledger: SqlLedger) -> int:
    with ledger.engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(work_items)).scalar_one()


@pytest.mark.parametrize("sql_ledger", ["sqlite"], indirect=True)
def test_statistics_are_read_at_the_first_week_and_as_the_table_doubles(sql_ledger, monkeypatch):
    monkeypatch.setattr(base, "ANALYZE_AFTER", FLOOR)
    monkeypatch.setattr(queue, "ANALYZE_AFTER", FLOOR)
    seen = []
    for week in WEEKS:
        seed_period(sql_ledger, CUSTOMERS, period=week)
        analysed = analysed_rows(sql_ledger)
        assert analysed is not None, "the first large enqueue analyses the table"
        # never more out of date than the rule allows ...
        assert rows(sql_ledger) <= FLOOR + 2 * analysed
        seen.append(analysed)
    # ... and not read again every week: at 20 rows, then at 60 (> 10 + 2 * 20), next at 140
    assert seen == [20, 20, 60, 60, 60, 60]
