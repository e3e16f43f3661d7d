"""Periods (ISO weeks) and operation keys: parsing, canonical forms, year boundaries, refusals."""

from datetime import UTC, date, datetime, timedelta

import pytest

from digest_pipeline.domain.errors import (
    DigestError,
    InvalidCustomerId,
    InvalidOperationKey,
    InvalidPeriod,
)
from digest_pipeline.domain.periods import OperationKey, Period

W42 = Period(2026, 42)
KEY = "digest:2026-W42:customer-1842"


# --- accepted spellings ---------------------------------------------------------------------


def test_iso_week_form_parses_to_that_week():
    assert Period.parse("2026-W42") == Period(2026, 42)


def test_monday_form_parses_to_the_week_it_starts():
    assert Period.parse("2026-10-12") == Period(2026, 42)


def test_partition_key_form_parses_to_that_week():
    assert Period.parse("2026-W42-1") == Period(2026, 42)


def test_iso_week_partition_key_and_monday_forms_are_the_same_period():
    assert Period.parse("2026-W42") == Period.parse("2026-W42-1") == Period.parse("2026-10-12")


def test_surrounding_whitespace_is_ignored():
    assert Period.parse(" 2026-W42\n") == W42


def test_str_is_the_canonical_iso_week_form():
    assert str(Period.parse("2026-10-12")) == "2026-W42"


def test_partition_key_is_the_iso_week_date_of_the_weeks_monday():
    assert Period.parse("2026-W42").partition_key == "2026-W42-1"
    assert date.fromisocalendar(2026, 42, 1) == date(2026, 10, 12)


@pytest.mark.parametrize(
    "text",
    [
        "2026-W42",  # an ordinary week
        "2026-W01",  # single-digit week keeps its leading zero
        "2026-W53",  # the 53rd week of a long year
        "2027-W01",  # the week after a 53rd week
        "2020-W53",  # another long year
    ],
)
def test_str_round_trips_through_parse(text):
    assert str(Period.parse(text)) == text


@pytest.mark.parametrize(
    ("monday", "key"),
    [
        ("2026-10-12", "2026-W42-1"),  # an ordinary week
        ("2025-12-29", "2026-W01-1"),  # a Monday in December that starts week 1 of the next year
        ("2026-12-28", "2026-W53-1"),  # the Monday of 2026-W53
        ("2027-01-04", "2027-W01-1"),  # the Monday of 2027-W01
        ("2021-01-04", "2021-W01-1"),  # a Monday in January after a week 53 (2020-W53)
    ],
)
def test_partition_key_round_trips_through_parse_and_names_the_mondays_week(monday, key):
    assert Period.parse(monday).partition_key == key
    assert Period.parse(key).partition_key == key
    assert Period.parse(key).monday == date.fromisoformat(monday)


# --- week 53 and the year boundary ----------------------------------------------------------


def test_2026_has_a_week_53():
    # 1 January 2026 is a Thursday, so ISO 8601 gives 2026 fifty-three weeks.
    assert date.fromisocalendar(2026, 53, 1) == date(2026, 12, 28)
    assert Period.parse("2026-W53").monday == date(2026, 12, 28)


def test_2025_has_no_week_53():
    with pytest.raises(ValueError, match="53"):
        date.fromisocalendar(2025, 53, 1)
    with pytest.raises(InvalidPeriod):
        Period.parse("2025-W53")


def test_new_years_day_2027_falls_in_2026_week_53():
    assert Period.of(date(2027, 1, 1)) == Period(2026, 53)


def test_monday_2026_12_28_parses_to_2026_week_53():
    assert Period.parse("2026-12-28") == Period(2026, 53)


def test_week_53_partition_key_is_2026_12_28_and_follows_week_52():
    assert Period.parse("2026-W53-1").starts_at == datetime(2026, 12, 28, tzinfo=UTC)
    assert Period(2026, 52).ends_at == Period.parse("2026-W53-1").starts_at


def test_the_partition_key_after_week_53_is_next_years_week_1():
    # 2027-01-03, a Sunday, still belongs to 2026-W53; the next Monday starts 2027-W01
    assert Period.of(date(2027, 1, 3)).partition_key == "2026-W53-1"
    assert Period.of(date(2027, 1, 4)).partition_key == "2027-W01-1"


def test_2025_has_no_week_53_partition_key():
    with pytest.raises(InvalidPeriod):
        Period.parse("2025-W53-1")


def test_week_53_ends_where_next_years_week_1_starts():
    assert Period(2026, 53).ends_at == Period(2027, 1).starts_at


def test_every_day_of_a_week_belongs_to_that_period():
    days = [date(2026, 10, 12) + timedelta(days=n) for n in range(7)]
    assert {Period.of(day) for day in days} == {W42}


def test_periods_order_chronologically_across_a_year_boundary():
    assert Period(2026, 52) < Period(2026, 53) < Period(2027, 1)


# --- instants -------------------------------------------------------------------------------


def test_starts_at_is_monday_midnight_utc():
    assert W42.starts_at == datetime(2026, 10, 12, tzinfo=UTC)


def test_starts_at_is_timezone_aware_utc():
    assert W42.starts_at.utcoffset() == timedelta(0)


def test_ends_at_is_timezone_aware_utc():
    assert W42.ends_at.utcoffset() == timedelta(0)


def test_ends_at_is_seven_days_after_starts_at():
    assert W42.ends_at - W42.starts_at == timedelta(days=7)


def test_ends_at_is_the_next_monday_midnight_utc():
    assert W42.ends_at == datetime(2026, 10, 19, tzinfo=UTC)


# --- refusals -------------------------------------------------------------------------------

REJECTED_PERIODS = [
    "2026-W54",  # beyond the last ISO week of any year
    "2026-W00",  # ISO weeks start at 1
    "2025-W53",  # a 52-week year has no week 53
    "2026-10-13",  # a Tuesday, not the Monday that starts the week
    "2027-01-01",  # a Friday, even though it belongs to 2026-W53
    "2026-02-30",  # not a calendar date
    "2026-13-01",  # no thirteenth month
    "",  # empty
    "   ",  # whitespace only
    "next week",  # garbage
    "2026-w42",  # the W is upper-case
    "26-W42",  # the year has four digits
    "2026-W4",  # the week has two digits
    "2026W42",  # ISO basic format is not accepted
    "2026-W42-3",  # an ISO week date of a Wednesday, not the Monday that starts the week
    "2026-W42-7",  # the Sunday that ends the week
    "2026-W42-0",  # ISO weekdays run from 1 to 7
    "2026-W42-01",  # the weekday has one digit
    "2026-W54-1",  # the week does not exist
    "20261012",  # basic calendar date
    "2026-10-12T00:00:00+00:00",  # a timestamp, not a period
    "2026-W42\nx",  # trailing content after a newline
]


@pytest.mark.parametrize("text", REJECTED_PERIODS)
def test_malformed_or_nonexistent_period_is_rejected(text):
    with pytest.raises(InvalidPeriod):
        Period.parse(text)


@pytest.mark.parametrize("text", REJECTED_PERIODS)
def test_period_rejection_message_is_one_line(text):
    with pytest.raises(InvalidPeriod) as excinfo:
        Period.parse(text)
    assert "\n" not in str(excinfo.value)


def test_tuesday_rejection_message_mentions_monday():
    with pytest.raises(InvalidPeriod, match="Monday"):
        Period.parse("2026-10-13")


def test_week_date_of_another_day_is_refused_naming_the_mondays_key():
    with pytest.raises(InvalidPeriod, match=r"day 3 of 2026-W42, not the Monday \(2026-W42-1\)"):
        Period.parse("2026-W42-3")


@pytest.mark.parametrize(
    "value",
    [
        None,  # nothing at all
        202642,  # a number
        date(2026, 10, 12),  # a date object, not text
        b"2026-W42",  # bytes, not text
    ],
)
def test_non_string_period_is_rejected(value):
    with pytest.raises(InvalidPeriod):
        Period.parse(value)


def test_constructing_a_nonexistent_week_is_rejected():
    with pytest.raises(InvalidPeriod):
        Period(2026, 54)


def test_invalid_period_is_a_digest_error():
    assert issubclass(InvalidPeriod, DigestError)


def test_invalid_period_is_a_value_error():
    assert issubclass(InvalidPeriod, ValueError)


def test_period_with_non_ascii_digits_is_rejected():
    with pytest.raises(InvalidPeriod):
        Period.parse("٢٠٢٦-W42")


# --- operation keys -------------------------------------------------------------------------


def test_operation_key_parses_into_period_and_customer_id():
    assert OperationKey.parse(KEY) == OperationKey(W42, "customer-1842")


def test_operation_key_round_trips_through_str():
    assert str(OperationKey.parse(KEY)) == KEY


def test_operation_key_accepts_a_128_character_customer_id():
    customer_id = "c" * 128
    assert OperationKey.parse(f"digest:2026-W42:{customer_id}").customer_id == customer_id


REJECTED_KEYS = [
    "vip-digest:2026-W42:customer-1842",  # an instance's name holds no '-'
    "1digest:2026-W42:customer-1842",  # an instance's name starts with a letter
    "a" * 23 + ":2026-W42:customer-1842",  # an instance's name is at most 22 characters
    "Digest:2026-W42:customer-1842",  # the prefix is lower-case
    "digest:2026-W42",  # customer id part missing
    "digest",  # period and customer id missing
    "",  # empty
    "digest:2026-W42:customer-1842:1",  # extra colon (an attempt number never belongs in a key)
    "digest:2026-10-12:customer-1842",  # Monday form: keys carry the canonical ISO week
    "digest:2026-W42-1:customer-1842",  # partition key form: keys carry the canonical ISO week
    "digest:2026-W54:customer-1842",  # nonexistent week
    "digest::customer-1842",  # empty period
    "digest:2026-W42:",  # empty customer id
    "digest:2026-W42:customer 1842",  # space in the customer id
    "digest:2026-W42:a:b",  # colon in the customer id
    "digest:2026-W42:" + "c" * 129,  # customer id longer than 128 characters
    "digest:2026-W42:-customer",  # customer id must start with a letter or digit
]


@pytest.mark.parametrize("text", REJECTED_KEYS)
def test_malformed_operation_key_is_rejected(text):
    with pytest.raises(InvalidOperationKey):
        OperationKey.parse(text)


@pytest.mark.parametrize("text", REJECTED_KEYS)
def test_operation_key_rejection_message_is_one_line(text):
    with pytest.raises(InvalidOperationKey) as excinfo:
        OperationKey.parse(text)
    assert "\n" not in str(excinfo.value)


@pytest.mark.parametrize(
    "value",
    [
        None,  # nothing at all
        42,  # a number
        b"digest:2026-W42:customer-1842",  # bytes, not text
    ],
)
def test_non_string_operation_key_is_rejected(value):
    with pytest.raises(InvalidOperationKey):
        OperationKey.parse(value)


def test_constructing_a_key_with_an_invalid_customer_id_is_rejected():
    with pytest.raises(InvalidCustomerId):
        OperationKey(W42, "a:b")


def test_invalid_operation_key_is_a_digest_error():
    assert issubclass(InvalidOperationKey, DigestError)


def test_invalid_operation_key_is_a_value_error():
    assert issubclass(InvalidOperationKey, ValueError)


def test_customer_id_with_trailing_newline_is_rejected():
    with pytest.raises(InvalidCustomerId):
        OperationKey(W42, "customer-1842\n")


def test_operation_key_with_newline_after_period_is_rejected():
    with pytest.raises(InvalidOperationKey):
        OperationKey.parse("digest:2026-W42\n:customer-1842")
