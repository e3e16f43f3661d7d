"""The delivery decisions of `domain/transitions.py`, held by properties over every input."""

from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import Claim, WorkItem
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.states import CLAIMABLE, DeliveryState
from digest_pipeline.domain.transitions import (
    after_attempt,
    before_send,
    is_due,
    sweep_reason,
    unknown_expired,
)
from digest_pipeline_tests.builders import key_of
from digest_pipeline_tests.conftest import T0

POLICY = DeliveryPolicy()
offsets = st.integers(min_value=-10 * 86_400, max_value=10 * 86_400).map(
    lambda s: timedelta(seconds=s)
)
maybe_offsets = st.none() | offsets


@st.composite
def claims(draw: st.DrawFn) -> Claim:
    item = WorkItem(
        key_of(draw(st.integers(1, 50))),
        DeliveryState.CLAIMED,
        created_at=T0 - timedelta(days=1),
        next_attempt_at=None,
        attempts=draw(st.integers(0, 12)),
        budget_used=draw(st.integers(0, 12)),
        window_started_at=None if (w := draw(maybe_offsets)) is None else T0 + w,
        first_attempt_at=T0 - timedelta(hours=1),
        dedupe_until=None if (d := draw(maybe_offsets)) is None else T0 + d,
        replayed_at=T0 if draw(st.booleans()) else None,
        lease_token=(token := draw(st.integers(1, 9))),
    )
    return Claim(item, token, "w", T0 + POLICY.lease)


outcomes = st.one_of(
    st.builds(SendOutcome.sent, st.text(min_size=1, max_size=8)),
    st.builds(
        SendOutcome.failed,
        st.sampled_from(FailureClass),
        st.text(max_size=8),
        retry_after=st.none() | st.integers(0, 7_200).map(lambda s: timedelta(seconds=s)),
    ),
)


@given(claims(), outcomes, maybe_offsets, st.floats(0, 1, exclude_max=True))
def test_an_attempt_moves_its_claim_by_its_outcome_and_never_fails_a_possible_delivery(
    claim, outcome, close, jitter
):
    closes_at = None if close is None else T0 + close
    t = after_attempt(
        claim,
        outcome,
        started_at=T0,
        closes_at=closes_at,
        now=T0,
        policy=POLICY,
        rand=lambda: jitter,
    )
    assert (t.key, t.expected, t.token, t.at) == (claim.key, DeliveryState.CLAIMED, claim.token, T0)
    if outcome.accepted:
        assert t.target is DeliveryState.SENT
        assert t.provider_message_id == outcome.provider_message_id
        return
    assert t.target in (
        DeliveryState.RETRY_SCHEDULED,
        DeliveryState.DEAD_LETTERED,
        DeliveryState.FAILED,
        DeliveryState.UNKNOWN,
    )
    assert t.failure_class is outcome.failure_class
    assert t.refund_budget == (outcome.failure_class is FailureClass.THROTTLED)
    if outcome.failure_class is FailureClass.UNKNOWN:
        assert t.target is DeliveryState.UNKNOWN
    if claim.item.dedupe_until is not None:
        # the first send may have been delivered: never `failed`
        assert t.target is not DeliveryState.FAILED
    if t.target is DeliveryState.RETRY_SCHEDULED:
        assert t.next_attempt_at is not None
        # full jitter (design: retry_delay) may draw a zero delay: due at once, never earlier
        assert t.next_attempt_at >= T0
        assert closes_at is None or t.next_attempt_at < closes_at
    if t.target in (DeliveryState.DEAD_LETTERED, DeliveryState.FAILED):
        assert t.dead_letter_reason


@given(claims(), maybe_offsets)
def test_a_send_is_replaced_only_when_the_window_or_the_dedupe_guarantee_is_gone(claim, close):
    closes_at = None if close is None else T0 + close
    t = before_send(claim, closes_at, T0, POLICY)
    closed = closes_at is not None and closes_at <= T0
    dedupe = claim.item.dedupe_until
    dedupe_gone = dedupe is not None and (closed or T0 + POLICY.lease >= dedupe)
    if dedupe_gone:
        assert t is not None
        assert t.target is DeliveryState.UNKNOWN
    elif closed:
        assert t is not None
        assert (t.target, t.dead_letter_reason) == (DeliveryState.DEAD_LETTERED, "window_closed")
    else:
        assert t is None


@given(st.sampled_from(DeliveryState), maybe_offsets, maybe_offsets, offsets)
def test_the_sweeper_runs_exactly_for_due_expired_and_unknown_items(state, due, lease, since):
    item = WorkItem(
        key_of(1),
        state,
        created_at=T0 + since,
        next_attempt_at=None if due is None else T0 + due,
        lease_expires_at=None if lease is None else T0 + lease,
    )
    why = sweep_reason(item, T0, POLICY.unknown_retention)
    assert is_due(item, T0) == (state in CLAIMABLE and due is not None and due <= timedelta(0))
    if is_due(item, T0):
        assert why == state.value
    elif state is DeliveryState.UNKNOWN:
        expired = unknown_expired(item, T0, POLICY.unknown_retention)
        assert expired == (item.created_at + POLICY.unknown_retention <= T0)
        assert why == ("unknown_expired" if expired else "unknown")
    elif state is DeliveryState.CLAIMED and lease is not None and lease <= timedelta(0):
        assert why == "claimed_expired"
    else:
        assert why is None
