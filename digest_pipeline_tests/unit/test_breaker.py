"""The circuit breaker's pure rules: what a streak is, when it opens, how much it lets start."""

import pytest

from digest_pipeline.domain.breaker import (
    Breaker,
    as_retryable,
    credentials_refused,
    recipient_addressing,
)
from digest_pipeline.domain.failures import FailureClass, SendOutcome

SENT = SendOutcome.sent("pm-1")


def failed(detail: str, fc: FailureClass = FailureClass.PERMANENT) -> SendOutcome:
    return SendOutcome.failed(fc, detail)


@pytest.mark.parametrize(
    ("detail", "refused"),
    [
        ("http:401", True),
        ("http:401:invalid_api_key", True),
        ("http:403:missing_api_key", True),
        ("smtp:535:5.7.8", True),
        ("smtp:530", True),
        ("http:4010", False),  # a code, not a prefix of one
        ("http:422:validation_error", False),  # the message, not our credentials
        ("smtp:550:5.1.1", False),  # the recipient
    ],
)
def test_credential_refusals_are_told_apart_from_recipient_and_payload_failures(detail, refused):
    assert credentials_refused(failed(detail)) is refused
    expected = FailureClass.TRANSIENT if refused else FailureClass.PERMANENT
    assert as_retryable(failed(detail)).failure_class is expected
    assert as_retryable(failed(detail)).detail == detail


def test_a_streak_of_the_same_code_opens_the_breaker_at_the_threshold():
    b = Breaker(3)
    for _ in range(2):
        b.record(failed("http:401"))
    assert (b.open, b.streak) == (False, 2)
    b.record(failed("http:401"))
    assert (b.open, b.streak) == (True, 3)
    assert "3 consecutive permanent failures with http:401" in b.reason()
    assert "credentials" in b.reason()


def test_a_success_or_another_code_starts_the_streak_again():
    b = Breaker(2)
    b.record(failed("smtp:421", FailureClass.TRANSIENT))
    b.record(failed("smtp:451", FailureClass.TRANSIENT))
    b.record(SENT)
    b.record(failed("smtp:451", FailureClass.TRANSIENT))
    assert (b.open, b.streak) == (False, 1)


@pytest.mark.parametrize("threshold", [None, 0])
def test_no_threshold_never_opens_and_never_bounds(threshold):
    b = Breaker(threshold)
    for _ in range(1000):
        b.record(failed("http:401"))
    assert not b.open
    assert b.room(in_flight=500) is None


def test_until_a_send_succeeds_at_most_the_threshold_may_be_in_flight_or_failed():
    b = Breaker(20)
    assert b.room(in_flight=0) == 20
    assert b.room(in_flight=8) == 12
    for _ in range(5):
        b.record(failed("http:401"))
    assert b.room(in_flight=8) == 7
    assert b.room(in_flight=30) == 0


def test_a_proven_run_is_bounded_only_while_a_streak_runs():
    b = Breaker(20)
    b.record(SENT)
    assert b.room(in_flight=16) is None
    b.record(failed("http:500", FailureClass.TRANSIENT))
    assert b.room(in_flight=4) == 15


def test_a_block_of_unknown_users_is_a_dirty_list_not_a_broken_sender():
    b = Breaker(3)
    for _ in range(10):
        b.record(failed("smtp:550:5.1.1"))
    assert (b.open, b.streak) == (False, 0)
    assert recipient_addressing(failed("smtp:550:5.1.10"))
    assert not recipient_addressing(failed("smtp:550:5.7.1"))  # relaying denied: systemic
    assert not recipient_addressing(failed("smtp:550"))  # no enhanced code: can't tell
