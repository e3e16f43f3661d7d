"""Every timestamp the ledger reads back is aware, in `datetime.UTC`, and the instant written.

On PostgreSQL the ledger's sessions run in UTC, so values pass through as psycopg made them;
a session whose zone was changed behind the ledger's back (a pooler's reset, a hand-run `SET`)
still reads the same instants, converted to UTC.
"""

from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import Engine, insert, select, text

from digest_pipeline.adapters.sql.schema import period_runs
from digest_pipeline_tests.conftest import SQL_BACKENDS

#: an instant written from another zone: stored as the same instant
WRITTEN = datetime(2026, 10, 12, 8, 30, 15, 123456, tzinfo=timezone(timedelta(hours=2)))


def stored(engine: Engine) -> datetime:
    with engine.begin() as conn:
        conn.execute(
            insert(period_runs),
            {
                "period": "2026-W42",
                "selection_run_id": "run",
                "selected_at": WRITTEN,
                "eligible_count": 1,
                "fingerprint": "f",
            },
        )
    with engine.connect() as conn:
        value: datetime = conn.execute(select(period_runs.c.selected_at)).scalar_one()
    return value


@pytest.mark.parametrize("backend", SQL_BACKENDS)
def test_a_timestamp_comes_back_in_utc_as_the_instant_written(
    backend: str, sql_engine_factory: Callable[[str], Engine]
) -> None:
    value = stored(sql_engine_factory(backend))
    assert value.tzinfo is UTC
    assert value == WRITTEN
    assert value.utcoffset() == timedelta(0)


@pytest.mark.integration
def test_postgres_sessions_of_the_ledger_run_in_utc(
    sql_engine_factory: Callable[[str], Engine],
) -> None:
    engine = sql_engine_factory("postgres")
    with engine.connect() as conn:
        assert conn.execute(text("SHOW TIME ZONE")).scalar_one() == "UTC"


@pytest.mark.integration
def test_a_session_moved_to_another_zone_still_reads_utc(
    sql_engine_factory: Callable[[str], Engine],
) -> None:
    engine = sql_engine_factory("postgres")
    stored(engine)
    with engine.connect() as conn:
        conn.execute(text("SET TIME ZONE 'America/New_York'"))
        try:
            value = conn.execute(select(period_runs.c.selected_at)).scalar_one()
        finally:
            conn.execute(text("SET TIME ZONE 'UTC'"))  # the pooled connection goes back as it came
    assert value.tzinfo is UTC
    assert value == WRITTEN
