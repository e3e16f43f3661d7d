"""The cleanup gate: open only once delivery is confirmed."""

import pytest

from digest_pipeline.domain.gate import GateDecision, cleanup_gate
from digest_pipeline.domain.states import DeliveryState

NOT_SENT = [s for s in DeliveryState if s is not DeliveryState.SENT]


def test_gate_is_open_for_sent():
    assert cleanup_gate(DeliveryState.SENT) == GateDecision(open=True, reason="sent")


@pytest.mark.parametrize("state", NOT_SENT, ids=lambda s: s.value)
def test_gate_is_closed_for_every_state_but_sent(state):
    assert not cleanup_gate(state).open


def test_gate_reports_cleaned_as_already_cleaned():
    assert cleanup_gate(DeliveryState.CLEANED).reason == "already_cleaned"


@pytest.mark.parametrize(
    "state",
    [s for s in NOT_SENT if s is not DeliveryState.CLEANED],
    ids=lambda s: s.value,
)
def test_gate_reason_names_the_state_that_is_not_sent(state):
    assert cleanup_gate(state).reason == f"not_sent:{state.value}"
