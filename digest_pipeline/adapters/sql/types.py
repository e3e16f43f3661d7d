"""A column type that stores timezone-aware UTC datetimes on SQLite and PostgreSQL alike.

SQLite has no time zone type; storing naive UTC and re-attaching UTC on read keeps every datetime
the ledger returns aware, and a naive value handed in is refused rather than guessed at.
"""

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
        if value is None:
            return None
        assert isinstance(value, datetime)
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
