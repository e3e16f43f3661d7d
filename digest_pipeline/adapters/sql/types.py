"""A column type that stores timezone-aware UTC datetimes on SQLite and PostgreSQL alike.

SQLite has no time zone type; storing naive UTC and re-attaching UTC on read keeps every datetime
the ledger returns aware, and a naive value handed in is refused rather than guessed at.
"""

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import DateTime
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator


class UtcDateTime(TypeDecorator[datetime]):
    """`TIMESTAMP WITH TIME ZONE` on PostgreSQL, naive-UTC text on SQLite; always aware in Python."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(
                "naive datetime handed to the ledger; every datetime must be UTC-aware"
            )
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        assert value is None or isinstance(value, datetime)
        return _utc(value)

    def result_processor(
        self, dialect: Dialect, coltype: object
    ) -> Callable[[Any], datetime | None] | None:
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
