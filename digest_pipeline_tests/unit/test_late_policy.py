"""The missed-week rule: refused only when the window closed before any attempt and no grant."""

from datetime import timedelta

import pytest

from digest_pipeline.domain.errors import InvalidPolicy
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline_tests.conftest import W42

POLICY = DeliveryPolicy(delivery_window=timedelta(days=7), late_window=timedelta(days=1))
CLOSES = W42.ends_at + timedelta(days=7)


@pytest.mark.parametrize(
    ("now", "attempted", "late_since", "refused"),
    [
        (CLOSES - timedelta(seconds=1), False, None, False),  # window still open
        (CLOSES, False, None, True),  # closed, never attempted: a missed week
        (CLOSES + timedelta(days=30), True, None, False),  # attempted in time: normal rules
        (CLOSES + timedelta(days=3), False, CLOSES + timedelta(days=3), False),  # just granted
        (CLOSES + timedelta(days=5), False, CLOSES + timedelta(days=3), True),  # grant lapsed
    ],
)
def test_a_week_is_refused_only_when_missed_and_not_granted(now, attempted, late_since, refused):
    why = POLICY.late_refusal(W42, now, attempted, late_since)
    assert (why is not None) == refused
    if why is not None:
        assert why.startswith("period 2026-W42: ")
        assert "--deliver-late --reason TEXT" in why


def test_a_grant_opens_a_bounded_window_from_the_grant_and_never_shortens_one():
    granted = CLOSES + timedelta(days=10)
    assert POLICY.closes_at(W42, granted) == granted + timedelta(days=1)
    early = W42.ends_at  # a grant inside the normal window does not shorten it
    assert POLICY.closes_at(W42, early) == CLOSES


def test_the_late_window_must_be_positive():
    with pytest.raises(InvalidPolicy, match="late_window"):
        DeliveryPolicy(late_window=timedelta(0))
