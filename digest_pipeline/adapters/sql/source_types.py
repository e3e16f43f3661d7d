"""The column types a mapped shop source is read through: each value checked and made the domain's.

A shop's database says less than the ledger's schema: SQLite keeps booleans as 0/1 and times as
text, ids are often integers, PostgreSQL's `numeric` comes back as Decimal. Each field is read
through `SourceValue`, which turns what the driver hands over into the domain's type or raises
`InvalidSource` naming the record kind, the column and the field and what it found (its type,
never the value, which may be an address).
"""

import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import BigInteger, Boolean, DateTime, Integer, String, Uuid
from sqlalchemy.engine import Dialect, processors
from sqlalchemy.types import TypeDecorator, TypeEngine

from digest_pipeline.source_settings import InvalidSource

#: the kind of each field: `id` is text or a whole number (read as its decimal text)
KINDS: dict[str, str] = {
    "customer_id": "id",
    "email": "text",
    "active": "flag",
    "opted_in": "flag",
    "product_id": "id",
    "title": "text",
    "category": "text",
    "price_cents": "whole",
    "currency": "text",
    "url": "text",
    "image_url": "text",
    "created_at": "instant",
    "order_id": "id",
    "ordered_at": "instant",
}
_EXPECTED = {
    "id": "text, a whole number or a uuid",
    "text": "text",
    "flag": "true/false (or 1/0)",
    "whole": "a whole number",
    "instant": "a date and time",
}
_IMPL: dict[str, TypeEngine[Any]] = {
    "id": String(),
    "text": String(),
    "flag": Boolean(),
    "whole": BigInteger(),
    "instant": DateTime(timezone=True),
}


def found(value: object) -> str:
    """What a value is, in words for a refusal: its kind, never the value itself."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int):
        return "a whole number"
    if isinstance(value, float | Decimal):
        whole = (
            value == value.to_integral_value() if isinstance(value, Decimal) else value.is_integer()
        )
        return "a decimal number" if whole else "a fraction"
    if isinstance(value, str):
        return "text"
    if isinstance(value, datetime):
        return "a date and time"
    return type(value).__name__


def expected(field: str) -> str:
    """What a field's column must hold, in words for a refusal: `true/false (or 1/0)`."""
    return _EXPECTED[KINDS[field]]


class SourceValue(TypeDecorator[Any]):
    """One mapped field: the driver's value checked and converted, or `InvalidSource`.

    `where` names it in a refusal: `customers (table users): column marketing_consent
    (opted_in)`. A time without a zone is UTC; on SQLite a time is ISO 8601 text.
    """

    impl = String
    cache_ok = True

    def __init__(self, field: str, where: str, nullable: bool = False) -> None:
        super().__init__()
        self.field, self.where, self.nullable = field, where, nullable

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        return dialect.type_descriptor(_IMPL[KINDS[self.field]])

    def refusal(self, value: object) -> InvalidSource:
        """The one line a value of the wrong kind is refused with."""
        return InvalidSource(
            f"{self.where} holds {found(value)} where {expected(self.field)} is expected"
        )

    def bind_processor(self, dialect: Dialect) -> Callable[[Any], Any] | None:
        if KINDS[self.field] == "instant" and dialect.name == "sqlite":
            return sqlite_instant_text
        return super().bind_processor(dialect)

    def result_processor(self, dialect: Dialect, coltype: object) -> Callable[[Any], Any]:
        convert = _CONVERTERS[KINDS[self.field]]
        sqlite, nullable, refuse = dialect.name == "sqlite", self.nullable, self.refusal

        def process(value: Any) -> Any:
            if value is None and nullable:
                return None
            out = convert(value, sqlite)
            if out is _BAD:
                raise refuse(value)
            return out

        return process


_BAD = object()


def _id(value: Any, sqlite: bool) -> Any:
    cls = value.__class__
    if cls is str:
        return value
    # an integer or uuid key, read as the text an operation key and the ledger hold
    return str(value) if cls is int or cls is uuid.UUID else _BAD


def _text(value: Any, sqlite: bool) -> Any:
    return value if value.__class__ is str else _BAD


def _flag(value: Any, sqlite: bool) -> Any:
    if value is True or value is False:
        return value
    # SQLite has no boolean type, and a PostgreSQL shop may keep one in a smallint
    return bool(value) if value.__class__ is int and value in (0, 1) else _BAD


def _whole(value: Any, sqlite: bool) -> Any:
    if value.__class__ is int:
        return value
    # PostgreSQL's numeric, read as Decimal: whole numbers only, so a price never rounds
    if isinstance(value, Decimal) and value.is_finite() and value == value.to_integral_value():
        return int(value)
    return _BAD


def _instant(value: Any, sqlite: bool) -> Any:
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if isinstance(value, date):  # a day without a time: its first instant, UTC
        return datetime(value.year, value.month, value.day, tzinfo=UTC)
    if sqlite and isinstance(value, str):
        try:
            return _instant(processors.str_to_datetime(value), sqlite)
        except ValueError:
            return _BAD
    return _BAD


_CONVERTERS: dict[str, Callable[[Any, bool], Any]] = {
    "id": _id,
    "text": _text,
    "flag": _flag,
    "whole": _whole,
    "instant": _instant,
}


def sqlite_instant_text(value: datetime | None) -> str | None:
    """A window bound as SQLite text: `2026-10-19 00:00:00`, the fraction only when it has one.

    A period's bounds are midnights, and without the `.000000` a stored `2026-10-19 00:00:00`
    (SQLite's own `datetime()` spelling) compares equal to the bound instead of below it; a
    stored `…T…` spelling still sorts inside the right day.
    """
    if value is None:
        return None
    if value.tzinfo is None:
        raise ValueError("a window bound must be timezone-aware")
    utc = value.astimezone(UTC).replace(tzinfo=None)
    return utc.isoformat(" ", "microseconds" if utc.microsecond else "seconds")


_BIGINT = 2**63


def whole_id(text: str) -> int | None:
    """`text` as an integer id column holds it, or None: `42` is 42; `042`, `4_2` are no id there."""
    try:
        value = int(text)
    except ValueError:
        return None
    return value if str(value) == text and -_BIGINT <= value < _BIGINT else None


def uuid_id(text: str) -> str | None:
    """`text` if it is a UUID as PostgreSQL prints one, else None (it cannot match a uuid column)."""
    try:
        return text if str(uuid.UUID(text)) == text else None
    except ValueError:
        return None


def lookup_kind(declared: TypeEngine[Any] | None, sampled: Sequence[object]) -> str:
    """How the orders' customer ids are held: `whole`, `uuid` or `text`.

    The sampled values decide (a query's column has no declared type, and SQLite may hold
    anything anywhere); without any, the declared type does.
    """
    if sampled:
        if any(isinstance(v, int) and not isinstance(v, bool) for v in sampled):
            return "whole"
        return "uuid" if any(isinstance(v, uuid.UUID) for v in sampled) else "text"
    if isinstance(declared, Integer):
        return "whole"
    return "uuid" if isinstance(declared, Uuid) else "text"


def lookup(kind: str) -> tuple[TypeEngine[Any], Callable[[str], Any] | None]:
    """The type customer ids are bound as in an order lookup, and how an id becomes one.

    PostgreSQL compares an integer or uuid column only with its own kind, and the lookup must
    stay a plain comparison of the column, so that its index serves it.
    """
    if kind == "whole":
        return BigInteger(), whole_id
    if kind == "uuid":
        return Uuid(as_uuid=False), uuid_id
    return String(), None
