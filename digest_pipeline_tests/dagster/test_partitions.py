"""The weekly partitions: ISO week date keys Dagster writes and parses, and their first week.

The keys are checked against Dagster's own `get_partition_keys` over decades (week 53 and every
year boundary among them); the first week is checked by calling `first_week` directly, on real
SQLite ledgers (and PostgreSQL under `make test`), never by re-importing the definitions.
"""

import logging
import sqlite3
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import Engine

from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.cli import main
from digest_pipeline.component.partitions import (
    first_week,
    latest_complete_week,
    require_partition,
    weekly_partitions_from,
)
from digest_pipeline.domain.errors import InvalidPeriod
from digest_pipeline.domain.periods import FIRST_PERIOD, Period
from digest_pipeline.rigs.seeding import seed_period
from digest_pipeline.settings import InvalidSetting, load_settings
from digest_pipeline_tests.conftest import SQL_BACKENDS, T0, W42
from digest_pipeline_tests.dagster.graph import partitions

#: Sunday 2026-12-06 18:00 UTC: the latest complete week is 2026-W48 (ISO week 49 is running)
NOW = datetime(2026, 12, 6, 18, 0, tzinfo=UTC)
LATEST = Period(2026, 48)


def url_of(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def env_for(url: str, **more: str) -> dict[str, str]:
    return {"DIGEST_DATABASE_URL": url, **more}


# --- keys: Dagster's and the project's agree ------------------------------------------------


def test_every_key_dagster_generates_over_decades_parses_to_the_period_it_names():
    partitions = weekly_partitions_from(FIRST_PERIOD)
    with dg.partition_loading_context(effective_dt=datetime(2046, 1, 1, tzinfo=UTC)):
        keys = partitions.get_partition_keys()

    periods = [Period.parse(key) for key in keys]
    assert [p.partition_key for p in periods] == keys
    # one key a week, in order, with no week missing or repeated across any year boundary
    assert [p.starts_at for p in periods] == [
        FIRST_PERIOD.starts_at + timedelta(weeks=n) for n in range(len(keys))
    ]
    assert periods[0] == FIRST_PERIOD
    # 2046-01-01 is a Monday: the last complete week is the one before, from 2045-12-25
    assert periods[-1] == Period(2045, 52) == Period.of(date(2045, 12, 25))
    for key, period in zip(keys[:60], periods[:60], strict=True):  # Dagster's windows, sampled
        window = partitions.time_window_for_partition_key(key)
        assert (window.start, window.end) == (period.starts_at, period.ends_at)
    # the long years in the range have their week 53, in Dagster's keys as in the calendar
    assert {p.year for p in periods if p.week == 53} == {2026, 2032, 2037, 2043}


def test_week_53_and_the_weeks_around_it_are_dagsters_keys_too():
    partitions = weekly_partitions_from(Period(2026, 50))
    with dg.partition_loading_context(effective_dt=datetime(2027, 1, 20, tzinfo=UTC)):
        keys = partitions.get_partition_keys()

    assert keys == [
        "2026-W50-1",
        "2026-W51-1",
        "2026-W52-1",
        "2026-W53-1",
        "2027-W01-1",
        "2027-W02-1",
    ]
    assert partitions.time_window_for_partition_key("2026-W53-1").start == datetime(
        2026, 12, 28, tzinfo=UTC
    )


@given(
    st.integers(
        min_value=int(FIRST_PERIOD.starts_at.timestamp()),
        max_value=int(datetime(2045, 12, 24, tzinfo=UTC).timestamp()),
    )
)
def test_any_instant_is_in_the_partition_of_its_period(timestamp):
    partitions = weekly_partitions_from(FIRST_PERIOD)

    key = partitions.get_partition_key_for_timestamp(timestamp)

    assert key == Period.of(datetime.fromtimestamp(timestamp, UTC).date()).partition_key


def test_the_projects_partitions_use_the_iso_week_date_keys():
    # the test suite's first week (conftest sets DIGEST_FIRST_WEEK)
    assert partitions().get_first_partition_key() == "2025-W02-1"
    assert partitions().has_partition_key(W42.partition_key)
    assert not partitions().has_partition_key("2026-10-12")  # the old Monday keys


# --- the first week -------------------------------------------------------------------------


def test_the_setting_names_the_first_week_and_the_ledger_is_not_read(tmp_path):
    missing = tmp_path / "none.db"
    env = env_for(f"sqlite:///{missing}", DIGEST_FIRST_WEEK="2026-W40")

    assert first_week(env, tmp_path, NOW) == Period(2026, 40)
    assert first_week({"DIGEST_FIRST_WEEK": "2026-W40-1"}, tmp_path, NOW) == Period(2026, 40)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("soon", "DIGEST_FIRST_WEEK='soon': period 'soon' is neither an ISO week"),
        ("2026-W54", "2026-W54 is not an ISO week"),
        ("2026-W40-3", "not the Monday"),
        ("2024-W50", "DIGEST_FIRST_WEEK=2024-W50: must be 2025-W02 or later"),
    ],
)
def test_a_bad_setting_is_refused_in_one_line_naming_it(tmp_path, value, says):
    with pytest.raises(InvalidSetting) as refused:
        first_week({"DIGEST_FIRST_WEEK": value}, tmp_path, NOW)
    assert says in str(refused.value)
    assert "\n" not in str(refused.value)
    with pytest.raises(InvalidSetting):
        load_settings({"DIGEST_FIRST_WEEK": value}, tmp_path)


def test_a_bad_setting_stops_the_cli_with_exit_2_and_one_line(tmp_path, capsys):
    code = main(["run", "--period", "2026-W42"], env={"DIGEST_FIRST_WEEK": "soon"}, root=tmp_path)

    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1
    assert "DIGEST_FIRST_WEEK='soon'" in err
    assert list(tmp_path.iterdir()) == []  # nothing made, no ledger


@pytest.mark.parametrize("backend", SQL_BACKENDS)
def test_the_ledgers_earliest_week_is_the_first(
    backend: str, sql_engine_factory: Callable[[str], Engine], tmp_path: Path
):
    engine = sql_engine_factory(backend)
    ledger = SqlLedger(engine)
    seed_period(ledger, 2, period=Period(2026, 40), now=T0)
    seed_period(ledger, 1, period=Period(2026, 38), now=T0, enqueue=False)  # snapshot only
    seed_period(ledger, 1, period=W42, now=T0)

    assert first_week(env_for(url_of(engine)), tmp_path, NOW) == Period(2026, 38)


@pytest.mark.parametrize("backend", SQL_BACKENDS)
def test_an_empty_ledger_starts_at_the_latest_complete_week(
    backend: str, sql_engine_factory: Callable[[str], Engine], tmp_path: Path
):
    engine = sql_engine_factory(backend)

    assert first_week(env_for(url_of(engine)), tmp_path, NOW) == LATEST


def test_a_ledger_week_after_the_latest_complete_one_still_leaves_that_week_a_partition(
    sql_engine_factory: Callable[[str], Engine], tmp_path: Path
):
    engine = sql_engine_factory("sqlite")
    seed_period(SqlLedger(engine), 1, period=Period(2026, 49), now=NOW)  # the running week

    assert first_week(env_for(url_of(engine)), tmp_path, NOW) == LATEST


def test_the_first_week_is_never_before_the_first_period(
    sql_engine_factory: Callable[[str], Engine], tmp_path: Path
):
    engine = sql_engine_factory("sqlite")
    seed_period(SqlLedger(engine), 1, period=Period(2024, 50), now=T0)

    assert first_week(env_for(url_of(engine)), tmp_path, NOW) == FIRST_PERIOD


def test_a_missing_sqlite_ledger_starts_at_the_latest_complete_week_and_stays_missing(tmp_path):
    folder = tmp_path / ".digest"

    # unset DIGEST_DATABASE_URL: the default file under the project folder
    assert first_week({}, tmp_path, NOW) == LATEST
    assert first_week(env_for(f"sqlite:///{folder / 'ledger.db'}"), tmp_path, NOW) == LATEST
    assert not folder.exists()


def test_an_unmigrated_database_counts_as_no_ledger_and_is_left_unmigrated(tmp_path, caplog):
    path = tmp_path / "ledger.db"
    sqlite3.connect(path).close()

    with caplog.at_level(logging.WARNING):
        assert first_week(env_for(f"sqlite:///{path}"), tmp_path, NOW) == LATEST

    assert caplog.records == []
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT name FROM sqlite_master").fetchall() == []


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///{tmp}/garbage.db",  # a file that is not a database
        "postgresql://nobody:hunter2secret@127.0.0.1:1/none",  # nothing listens there
        "postgres ql://nobody:hunter2secret@host/db",  # not a URL at all
    ],
)
def test_an_unreadable_ledger_falls_back_with_one_warning_and_no_password(tmp_path, caplog, url):
    (tmp_path / "garbage.db").write_bytes(b"not a database, " * 512)

    with caplog.at_level(logging.WARNING):
        found = first_week(env_for(url.format(tmp=tmp_path)), tmp_path, NOW)

    assert found == LATEST
    [record] = caplog.records
    line = record.getMessage()
    assert record.levelno == logging.WARNING
    assert "the ledger could not be read" in line
    assert "2026-W48" in line
    assert "DIGEST_FIRST_WEEK" in line
    assert "\n" not in line
    assert "hunter2secret" not in line


@pytest.mark.parametrize(
    ("now", "latest"),
    [
        (datetime(2026, 12, 6, 23, 59, tzinfo=UTC), Period(2026, 48)),  # Sunday: W49 is running
        (datetime(2026, 12, 7, 0, 0, tzinfo=UTC), Period(2026, 49)),  # Monday: W49 just ended
        (datetime(2027, 1, 4, 6, 0, tzinfo=UTC), Period(2026, 53)),  # ISO week 1 of 2027
        (datetime(2025, 12, 29, 6, 0, tzinfo=UTC), Period(2025, 52)),  # ISO week 1 of 2026
    ],
)
def test_the_latest_complete_week_is_the_one_before_the_current(now, latest):
    assert latest_complete_week(now) == latest


# --- a week before the first is refused -----------------------------------------------------


def test_a_week_before_the_first_is_refused_naming_the_setting():
    partitions = weekly_partitions_from(Period(2026, 40))

    require_partition(Period(2026, 40), partitions)
    require_partition(W42, partitions)
    with pytest.raises(InvalidPeriod) as refused:
        require_partition(Period(2026, 39), partitions)
    assert str(refused.value) == (
        "period 2026-W39 is before 2026-W40, the weekly job's first week: set "
        "DIGEST_FIRST_WEEK=2026-W39 (or earlier), for digest and Dagster alike, to run it"
    )


def test_a_week_before_the_first_period_or_not_yet_over_is_refused_too():
    with pytest.raises(InvalidPeriod, match="before 2025-W02, the first week any run has"):
        require_partition(Period(2024, 50), partitions())
    with pytest.raises(InvalidPeriod, match="it has not ended"):
        require_partition(Period.of(datetime.now(UTC).date()), partitions())
