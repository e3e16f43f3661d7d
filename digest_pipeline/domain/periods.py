"""Periods (ISO weeks) and operation keys: the identities every other piece agrees on.

A period is written `2026-W42`; its Dagster partition key is the ISO 8601 week date of its Monday,
`2026-W42-1`, and the Monday's calendar date `2026-10-12` is accepted too: all three parse to the
same `Period`. An operation key, `digest:2026-W42:customer-1842`, names one customer's digest for
one period in one digest instance (its first part: `digest`, the default, or another instance's
name such as `vip_digest`) and never carries an attempt number. Two instances on one provider
account so never share an Idempotency-Key, a Message-ID or an outbox file.
"""

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache

from digest_pipeline.domain.errors import (
    InvalidCustomerId,
    InvalidInstanceName,
    InvalidOperationKey,
    InvalidPeriod,
)

_ISO_WEEK = re.compile(r"([0-9]{4})-W([0-9]{2})")
#: an ISO week date (`%G-W%V-%u`), the form of a partition key
_WEEK_DATE = re.compile(r"([0-9]{4})-W([0-9]{2})-([0-9])")
_MONDAY = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})")
# fullmatch, not match + $: `$` lets a trailing newline through.
# Colons separate the parts of an operation key and whitespace breaks headers and logs.
_CUSTOMER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
#: a digest instance's name: it prefixes Dagster asset keys and job names too, which take only
#: letters, digits and `_`, and it is the first part of an operation key, so never a `:`. At
#: most 22 characters: with `:2026-W42:` and a 128-character customer id the key still fits the
#: ledger's 160-character key columns.
INSTANCE_PATTERN = r"[a-z][a-z0-9_]{0,21}"
_INSTANCE = re.compile(INSTANCE_PATTERN)
#: `INSTANCE_PATTERN` in words, for every refusal of a name
INSTANCE_RULE = "a lower-case letter followed by at most 21 lower-case letters, digits or '_'"
#: the instance a process works for unless it is configured with another; its keys are `digest:…`
DEFAULT_INSTANCE = "digest"


@dataclass(frozen=True, order=True)
class Period:
    """One ISO week, the unit of selection, delivery and idempotency."""

    year: int
    week: int

    def __post_init__(self) -> None:
        try:
            date.fromisocalendar(self.year, self.week, 1)
        except ValueError as e:
            raise InvalidPeriod(f"{self.year}-W{self.week:02d} is not an ISO week") from e

    @classmethod
    def parse(cls, text: str) -> "Period":
        """Parses `2026-W42`, its partition key `2026-W42-1` or its Monday `2026-10-12`.

        Anything else, a day other than the Monday included, raises InvalidPeriod.
        """
        # every ledger row names its week: a handful of texts, parsed once each
        return _parse_period(text) if isinstance(text, str) else cls._parse(text)

    @classmethod
    def _parse(cls, text: str) -> "Period":
        raw = text.strip() if isinstance(text, str) else ""
        if m := _ISO_WEEK.fullmatch(raw):
            return cls(int(m.group(1)), int(m.group(2)))
        if m := _WEEK_DATE.fullmatch(raw):
            period = cls(int(m.group(1)), int(m.group(2)))
            if m.group(3) != "1":
                raise InvalidPeriod(
                    f"period {text!r}: {raw} is day {m.group(3)} of {period}, not the Monday "
                    f"({period}-1) that starts it"
                )
            return period
        if _MONDAY.fullmatch(raw):
            try:
                day = date.fromisoformat(raw)
            except ValueError as e:
                raise InvalidPeriod(f"period {text!r}: {raw} is not a calendar date") from e
            if day.isoweekday() != 1:
                raise InvalidPeriod(
                    f"period {text!r}: {raw} is a {day:%A}, not the Monday that starts a week"
                )
            return cls.of(day)
        raise InvalidPeriod(
            f"period {text!r} is neither an ISO week like 2026-W42 nor its partition key like "
            "2026-W42-1 or its Monday like 2026-10-12"
        )

    @classmethod
    def of(cls, day: date) -> "Period":
        """The period that contains a calendar day."""
        year, week, _ = day.isocalendar()
        return cls(year, week)

    @property
    def monday(self) -> date:
        return date.fromisocalendar(self.year, self.week, 1)

    @property
    def partition_key(self) -> str:
        """The Dagster partition key: the Monday's ISO week date, `2026-W42-1` (`%G-W%V-%u`).

        The UI's partition filter then finds a week by typing `W42`.
        """
        return f"{self}-1"

    @property
    def starts_at(self) -> datetime:
        return datetime.combine(self.monday, datetime.min.time(), tzinfo=UTC)

    @property
    def ends_at(self) -> datetime:
        """The first instant after the week (next Monday 00:00 UTC)."""
        return self.starts_at + timedelta(days=7)

    def __str__(self) -> str:
        text: str | None = self.__dict__.get("_text")
        if text is None:
            text = f"{self.year}-W{self.week:02d}"
            _remember_text(self, text)
        return text


@lru_cache(maxsize=1024)
def _parse_period(text: str) -> Period:
    return Period._parse(text)


def _remember_text(value: object, text: str) -> None:
    """Keeps a frozen value's text on it, made once an instance.

    Keys become text once a row, millions a week. Not `functools.cached_property`: in Python
    3.11 the first read of every instance goes through its lock, one for all instances, which
    with the sort it serves costs a large share of a delivery thread's time.
    """
    object.__setattr__(value, "_text", text)


def validate_customer_id(customer_id: str) -> str:
    """Returns the id unchanged or raises InvalidCustomerId."""
    if not isinstance(customer_id, str) or not _CUSTOMER_ID.fullmatch(customer_id):
        raise InvalidCustomerId(
            f"customer id {customer_id!r} must be 1-128 characters of letters, digits, '.', '_' or '-'"
        )
    return customer_id


def validate_instance_name(name: str) -> str:
    """Returns the name unchanged or raises InvalidInstanceName."""
    if not isinstance(name, str) or not _INSTANCE.fullmatch(name):
        raise InvalidInstanceName(
            f"digest instance name {name!r} must be {INSTANCE_RULE} (it prefixes operation keys, "
            "asset keys and job names)"
        )
    return name


@dataclass(frozen=True, order=True)
class OperationKey:
    """`<instance>:<period>:<customer_id>`: one customer's digest for one period of one instance."""

    period: Period
    customer_id: str
    instance: str = DEFAULT_INSTANCE

    def __post_init__(self) -> None:
        validate_customer_id(self.customer_id)
        # the default needs no pattern match: nearly every key of nearly every install is one
        if self.instance != DEFAULT_INSTANCE:
            validate_instance_name(self.instance)

    @classmethod
    def parse(cls, text: str) -> "OperationKey":
        """Parses `digest:2026-W42:customer-1842` or another instance's; else InvalidOperationKey."""
        parts = text.strip().split(":") if isinstance(text, str) else []
        if (
            len(parts) != 3
            or not _INSTANCE.fullmatch(parts[0])
            or not _ISO_WEEK.fullmatch(parts[1])
        ):
            raise InvalidOperationKey(
                f"operation key {text!r} is not of the form <instance>:2026-W42:<customer_id> "
                f"(the default instance is {DEFAULT_INSTANCE})"
            )
        try:
            return cls(Period.parse(parts[1]), parts[2], parts[0])
        except (InvalidPeriod, InvalidCustomerId) as e:
            raise InvalidOperationKey(f"operation key {text!r}: {e}") from e

    @classmethod
    def carried(cls, value: object) -> "OperationKey | None":
        """The key `value` spells (a provider echoing ours back), or None: not text, or no key."""
        if not isinstance(value, str):
            return None
        try:
            return cls.parse(value)
        except InvalidOperationKey:
            return None

    def __str__(self) -> str:
        text: str | None = self.__dict__.get("_text")
        if text is None:
            text = f"{self.instance}:{self.period}:{self.customer_id}"
            _remember_text(self, text)
        return text

    def __hash__(self) -> int:
        # Equal keys have equal texts, and a str keeps its hash: a key is a dict key many times
        # a delivery, where the dataclass's hash built a tuple of its fields (one a dataclass).
        return hash(str(self))


#: the earliest week the pipeline can run (Monday 2025-01-06): no command accepts an earlier one,
#: and the weekly partitions never start before it (`defs/partitions.py` picks their first week)
FIRST_PERIOD = Period(2025, 2)
