"""SQLite's own binds of timestamps and inserted rows spell exactly what SQLAlchemy's would.

The ledger binds these itself for speed (a dozen timestamps an item; a week's digest rows in
one executemany); a ledger written before, or by SQLAlchemy's path, must compare, sort and
read back alike, so the text is checked against SQLAlchemy's own processors.
"""

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from sqlalchemy import (
    JSON,
    Column,
    DateTime,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    select,
)
from sqlalchemy.dialects import sqlite

from digest_pipeline.adapters.sql.bulk import bound_column, insert_rows
from digest_pipeline.adapters.sql.types import UtcDateTime

DIALECT = sqlite.dialect()
#: SQLAlchemy's SQLite DATETIME text, the format a ledger has always been written in
REFERENCE = DateTime().dialect_impl(DIALECT).bind_processor(DIALECT)
BIND = UtcDateTime().dialect_impl(DIALECT).bind_processor(DIALECT)
READ = UtcDateTime().dialect_impl(DIALECT).result_processor(DIALECT, None)
INSTANTS = [
    datetime(2026, 10, 12, 8, 30, 15, 123456, tzinfo=UTC),
    datetime(2026, 10, 12, 8, 30, 15, tzinfo=UTC),  # no microseconds: still six digits
    datetime(1, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
    datetime(999, 2, 3, 4, 5, 6, tzinfo=UTC),
    datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    datetime(2026, 3, 29, 1, 30, tzinfo=timezone(timedelta(hours=-7, minutes=-30))),
    pd.Timestamp("2026-10-12T08:30:15.123456Z").to_pydatetime(),
]


@pytest.mark.parametrize("instant", INSTANTS, ids=str)
def test_a_timestamp_is_bound_as_sqlalchemys_text_of_the_utc_instant(instant: datetime) -> None:
    assert BIND is not None
    assert READ is not None
    assert REFERENCE is not None
    text = BIND(instant)
    assert text == REFERENCE(instant.astimezone(UTC).replace(tzinfo=None))
    back = READ(text)
    assert back == instant
    assert back.tzinfo is UTC


def test_a_pandas_timestamp_is_bound_as_its_datetime() -> None:
    assert BIND is not None
    assert REFERENCE is not None
    stamp = pd.Timestamp("2026-10-12T08:30:15.123456789Z")  # its nanoseconds are dropped
    assert BIND(stamp) == REFERENCE(INSTANTS[0].replace(tzinfo=None))


@pytest.mark.parametrize("value", [INSTANTS[0].replace(tzinfo=None), "2026-10-12 08:30:15"])
def test_a_naive_or_non_datetime_value_is_refused(value: object) -> None:
    assert BIND is not None
    with pytest.raises((ValueError, TypeError)):
        BIND(value)


def test_text_written_with_an_offset_reads_as_the_utc_instant() -> None:
    assert READ is not None
    assert READ("2026-10-12 10:30:15.000000+02:00") == datetime(2026, 10, 12, 8, 30, 15, tzinfo=UTC)


META = MetaData()
ROWS = Table(
    "rows",
    META,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(20), nullable=False),
    Column("at", UtcDateTime, nullable=False),
    Column("payload", JSON, nullable=False),
    Column("tries", Integer, nullable=False, default=7),
)


def test_insert_rows_on_sqlite_stores_what_sqlalchemys_insert_stores(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'rows.db'}")
    META.create_all(engine)
    shared = {"product": "p-1", "lines": ["a", "b"]}  # one object in many rows, as content's
    at = datetime(2026, 10, 12, 8, 30, tzinfo=timezone(timedelta(hours=2)))
    given: list[dict[str, Any]] = [
        {"name": f"n{i}", "at": at, "payload": shared if i % 2 else {"i": i}, "tries": i}
        for i in range(6)
    ]
    # a column left out that has a Python-side default: SQLAlchemy's insert fills it in
    defaulted: list[dict[str, Any]] = [{"name": "d", "at": at, "payload": shared}]
    with engine.begin() as conn:
        insert_rows(conn, ROWS, given)
        insert_rows(conn, ROWS, defaulted)
    with engine.connect() as conn:
        stored = conn.execute(select(ROWS).order_by(ROWS.c.id)).mappings().all()
    assert [dict(r) | {"id": 0} for r in stored] == [
        {"id": 0, "name": r["name"], "at": at, "payload": r["payload"], "tries": r.get("tries", 7)}
        for r in [*given, *defaulted]
    ]
    engine.dispose()


@pytest.mark.parametrize(
    "values",
    [
        [],
        [INSTANTS[0]] * 5,  # one `now` in every row: bound once
        [INSTANTS[0], INSTANTS[0].replace(), INSTANTS[1]],  # equal, distinct and different
        [INSTANTS[1], *[INSTANTS[0]] * 3],
    ],
    ids=["empty", "one-object", "mixed", "first-differs"],
)
def test_a_column_is_bound_as_each_of_its_values_would_be(values: list[datetime]) -> None:
    assert BIND is not None
    assert bound_column(values, BIND) == [BIND(v) for v in values]
