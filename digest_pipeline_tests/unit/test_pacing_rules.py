"""The pure pacing rules: which answers pause every sender, for how long, and what waits."""

from datetime import timedelta
from pathlib import Path

import pytest

from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.pacing import (
    MAX_WAIT,
    QUOTA_PAUSE,
    Pause,
    held_back,
    paced_concurrency,
    pause_after,
    slot_interval,
)
from digest_pipeline.settings import load_settings
from digest_pipeline_tests.conftest import T0

LEASE = timedelta(minutes=2)


@pytest.mark.parametrize(
    ("outcome", "pause"),
    [
        # the provider said how long: every sender waits that long
        (
            SendOutcome.failed(
                FailureClass.THROTTLED, "http:429", retry_after=timedelta(seconds=2)
            ),
            Pause(T0 + timedelta(seconds=2), "http:429"),
        ),
        # a spent quota without a wait pauses for QUOTA_PAUSE; with one, for that
        (
            SendOutcome.failed(FailureClass.THROTTLED, "http:429:daily_quota_exceeded", quota=True),
            Pause(T0 + QUOTA_PAUSE, "http:429:daily_quota_exceeded"),
        ),
        (
            SendOutcome.failed(
                FailureClass.THROTTLED, "q", retry_after=timedelta(hours=3), quota=True
            ),
            Pause(T0 + timedelta(hours=3), "q"),
        ),
        # a throttle without a wait is this item's backoff; other failures pause nobody
        (SendOutcome.failed(FailureClass.THROTTLED, "smtp:452:4.5.3"), None),
        (SendOutcome.failed(FailureClass.TRANSIENT, "http:503", retry_after=timedelta(1)), None),
        (SendOutcome.sent("id-1"), None),
    ],
)
def test_only_a_stated_wait_or_a_spent_quota_pauses_every_sender(outcome, pause):
    assert pause_after(outcome, T0) == pause


def test_a_held_back_send_is_a_throttle_until_the_pause_ends_and_spends_no_budget():
    outcome = held_back(Pause(T0 + timedelta(minutes=5), "http:429:daily_quota_exceeded"), T0)
    assert outcome.failure_class is FailureClass.THROTTLED
    assert not outcome.accepted
    assert outcome.retry_after == timedelta(minutes=5)
    assert outcome.detail == "paused:http:429:daily_quota_exceeded"


@pytest.mark.parametrize("rate", [0.1, 2, 10, 50, 10_000])
def test_slots_leave_headroom_under_the_rate(rate):
    per_second = timedelta(seconds=1) / slot_interval(rate)
    assert 0.9 * rate <= per_second < rate


@pytest.mark.parametrize(("rate", "concurrency"), [(None, 64), (0.1, 1), (2, 30), (50, 64)])
def test_sends_in_flight_never_queue_past_what_an_attempt_may_wait(rate, concurrency):
    n = paced_concurrency(64, rate, LEASE)
    assert n == concurrency
    if rate is not None and n > 1:
        # the last send in flight gets its slot within half the wait bound
        assert n * slot_interval(rate) <= MAX_WAIT


def test_the_send_rate_reaches_the_delivery_policy():
    settings = load_settings({"DIGEST_SEND_RATE": "2.5"}, Path("."))
    assert settings.policy.send_rate == 2.5
    assert load_settings({}, Path(".")).policy.send_rate is None
