"""The work-item state machine: every (from, to) pair of states, allowed or refused."""

import itertools

import pytest

from digest_pipeline.domain.errors import DigestError, InvalidTransition
from digest_pipeline.domain.states import (
    ALLOWED_TRANSITIONS,
    CLAIMABLE,
    REPLAYABLE,
    TERMINAL,
    DeliveryState,
    check_transition,
)

# Design §3, written out here independently of states.py so a change to either shows up.
EXPECTED_ALLOWED: frozenset[tuple[DeliveryState, DeliveryState]] = frozenset(
    {
        (DeliveryState.PENDING, DeliveryState.CLAIMED),  # a worker claims a new item
        (DeliveryState.CLAIMED, DeliveryState.SENT),  # the provider confirmed the message
        (DeliveryState.SENT, DeliveryState.CLEANED),  # cleanup removed the generated rows
        (
            DeliveryState.CLAIMED,
            DeliveryState.RETRY_SCHEDULED,
        ),  # transient/throttled failure, or an expired unstarted claim
        (DeliveryState.RETRY_SCHEDULED, DeliveryState.CLAIMED),  # a due retry is claimed again
        (DeliveryState.CLAIMED, DeliveryState.UNKNOWN),  # the request may have reached the provider
        (DeliveryState.UNKNOWN, DeliveryState.SENT),  # reconciliation found evidence of the send
        (
            DeliveryState.UNKNOWN,
            DeliveryState.RETRY_SCHEDULED,
        ),  # reconciliation may resend with the same key
        (DeliveryState.UNKNOWN, DeliveryState.DEAD_LETTERED),  # unresolved past retention
        (DeliveryState.CLAIMED, DeliveryState.FAILED),  # permanent failure
        (
            DeliveryState.CLAIMED,
            DeliveryState.DEAD_LETTERED,
        ),  # states.py addition: the failing attempt exhausted a bound
        (
            DeliveryState.RETRY_SCHEDULED,
            DeliveryState.DEAD_LETTERED,
        ),  # a bound was hit while waiting
        (DeliveryState.DEAD_LETTERED, DeliveryState.PENDING),  # operator replay
        (DeliveryState.FAILED, DeliveryState.PENDING),  # operator replay
        # a suppressed customer's item whose attempt has not started is cancelled, not sent
        (DeliveryState.PENDING, DeliveryState.SUPPRESSED),
        (DeliveryState.RETRY_SCHEDULED, DeliveryState.SUPPRESSED),
        (DeliveryState.CLAIMED, DeliveryState.SUPPRESSED),
    }
)

ALL_PAIRS = list(itertools.product(DeliveryState, DeliveryState))
FORBIDDEN = [pair for pair in ALL_PAIRS if pair not in EXPECTED_ALLOWED]


def _ids(pairs: list[tuple[DeliveryState, DeliveryState]]) -> list[str]:
    return [f"{a.value}->{b.value}" for a, b in pairs]


ALLOWED_SORTED = sorted(EXPECTED_ALLOWED)


@pytest.mark.parametrize(("current", "target"), ALLOWED_SORTED, ids=_ids(ALLOWED_SORTED))
def test_allowed_transition_passes(current, target):
    check_transition(current, target)


@pytest.mark.parametrize(("current", "target"), FORBIDDEN, ids=_ids(FORBIDDEN))
def test_forbidden_transition_raises(current, target):
    with pytest.raises(InvalidTransition):
        check_transition(current, target)


def test_expected_table_and_forbidden_pairs_cover_every_pair_of_states():
    assert len(EXPECTED_ALLOWED) + len(FORBIDDEN) == len(DeliveryState) ** 2


def test_transition_table_matches_the_design():
    assert ALLOWED_TRANSITIONS == EXPECTED_ALLOWED


def test_invalid_transition_message_names_both_states():
    with pytest.raises(InvalidTransition, match="failed -> sent"):
        check_transition(DeliveryState.FAILED, DeliveryState.SENT)


def test_invalid_transition_is_a_digest_error():
    assert issubclass(InvalidTransition, DigestError)


# --- the enum ------------------------------------------------------------------------------


@pytest.mark.parametrize("state", list(DeliveryState), ids=lambda s: s.name)
def test_state_value_is_its_lower_case_name(state):
    assert state.value == state.name.lower()


def test_states_are_the_designs_eight_and_issue_16s_suppressed():
    assert {s.value for s in DeliveryState} == {
        "pending",
        "claimed",
        "sent",
        "cleaned",
        "retry_scheduled",
        "unknown",
        "failed",
        "dead_lettered",
        "suppressed",
    }


# --- the named sets -------------------------------------------------------------------------


def test_claimable_states_are_pending_and_retry_scheduled():
    assert frozenset({DeliveryState.PENDING, DeliveryState.RETRY_SCHEDULED}) == CLAIMABLE


def test_terminal_states_are_cleaned_failed_dead_lettered_and_suppressed():
    assert (
        frozenset(
            {
                DeliveryState.CLEANED,
                DeliveryState.FAILED,
                DeliveryState.DEAD_LETTERED,
                DeliveryState.SUPPRESSED,
            }
        )
        == TERMINAL
    )


def test_replayable_states_are_failed_and_dead_lettered():
    assert frozenset({DeliveryState.FAILED, DeliveryState.DEAD_LETTERED}) == REPLAYABLE


@pytest.mark.parametrize("state", sorted(CLAIMABLE), ids=lambda s: s.value)
def test_every_claimable_state_may_move_to_claimed(state):
    check_transition(state, DeliveryState.CLAIMED)


@pytest.mark.parametrize("state", sorted(REPLAYABLE), ids=lambda s: s.value)
def test_every_replayable_state_may_be_reopened_to_pending(state):
    check_transition(state, DeliveryState.PENDING)


@pytest.mark.parametrize("state", sorted(TERMINAL), ids=lambda s: s.value)
def test_terminal_states_leave_only_by_replay(state):
    exits = {target for current, target in EXPECTED_ALLOWED if current is state}
    assert exits == ({DeliveryState.PENDING} if state in REPLAYABLE else set())
