"""A column type that stores timezone-aware UTC datetimes on SQLite and PostgreSQL alike.

SQLite has no time zone type; storing naive UTC and re-attaching UTC on read keeps every datetime
the ledger returns aware, and a naive value handed in is refused rather than guessed at.
"""

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import DateTime
from sqlalchemy.engine import Dialect, processors
from sqlalchemy.types import TypeDecorator

_NAIVE = "naive datetime handed to the ledger; every datetime must be UTC-aware"


class UtcDateTime(TypeDecorator[datetime]):
    """`TIMESTAMP WITH TIME ZONE` on PostgreSQL, naive-UTC text on SQLite; always aware in Python."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(_NAIVE)
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def bind_processor(self, dialect: Dialect) -> Callable[[Any], Any] | None:
        if dialect.name != "sqlite":
            return super().bind_processor(dialect)
        # One call a value instead of the decorator's and SQLite DATETIME's two, which spelled
        # the same text through a %-format of seven fields: a week binds a dozen timestamps
        # an item (its claim, attempt, outcome and cleanup). The text is SQLAlchemy's storage
        # format exactly (adapters/test_sqlite_binds.py in the tests), so a ledger written by
        # either compares and sorts alike.
        return _sqlite_text

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        assert value is None or isinstance(value, datetime)
        return _utc(value)

    def result_processor(
        self, dialect: Dialect, coltype: object
    ) -> Callable[[Any], datetime | None] | None:
        if dialect.name == "sqlite":
            return _sqlite_instant
        if dialect.name != "postgresql":
            return super().result_processor(dialect, coltype)
        # psycopg hands over aware datetimes, already in UTC on the ledger's psycopg 3 sessions
        # (engine.py sets their time zone; another zone, a psycopg2 session's included, is
        # converted): one call a value instead of the decorator's two, for the dozen
        # timestamps of every work item a claim reads
        return _utc


def _utc(value: datetime | None) -> datetime | None:
    if value is None or value.tzinfo is UTC:
        return value
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _sqlite_text(value: datetime | None) -> str | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise TypeError(f"the ledger stores datetimes, not {type(value).__name__}")
    if value.tzinfo is None:
        raise ValueError(_NAIVE)
    if value.tzinfo is not UTC:
        value = value.astimezone(UTC)
    if type(value) is not datetime:  # a subclass (pandas' Timestamp) may spell isoformat its way
        value = datetime(*value.timetuple()[:6], value.microsecond, tzinfo=UTC)
    return value.replace(tzinfo=None).isoformat(" ", "microseconds")


def _sqlite_instant(value: str | None) -> datetime | None:
    # SQLAlchemy's own parser of SQLite's text, then UTC attached (or converted to, for a text
    # someone wrote with an offset)
    return None if value is None else _utc(processors.str_to_datetime(value))
