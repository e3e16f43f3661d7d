"""The delivery decisions of `domain/transitions.py` and `domain/reconciliation.py`, by property."""

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from digest_pipeline.domain.delivery import after_attempt, before_send
from digest_pipeline.domain.errors import InvalidTransition, LostRace, ResolveRefused
from digest_pipeline.domain.failures import FailureClass
from digest_pipeline.domain.model import (
    AuditNote,
    ClearDedupe,
    LookupResult,
    LookupStatus,
    RefundBudget,
    ResendUntil,
    WorkItem,
)
from digest_pipeline.domain.reconciliation import NOT_ACCEPTED, Evidence, settle_unknown
from digest_pipeline.domain.states import CLAIMABLE, REPLAYABLE, DeliveryState
from digest_pipeline.domain.transitions import (
    after_lease_expiry,
    apply,
    attempt_started,
    claimed,
    is_due,
    replayed,
    resolved,
    sweep_reason,
    unknown_expired,
)
from digest_pipeline_tests.builders import key_of
from digest_pipeline_tests.conftest import T0
from digest_pipeline_tests.unit.item_strategies import (
    MAILER,
    POLICY,
    claims,
    histories,
    maybe_offsets,
    offsets,
    outcomes,
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
    assert t.has(RefundBudget) == (outcome.failure_class is FailureClass.THROTTLED)
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


@given(st.sampled_from(DeliveryState), st.booleans(), offsets)
def test_an_expired_claim_with_an_open_attempt_is_never_put_back_as_not_sent(state, open_, since):
    item = WorkItem(
        key_of(1), DeliveryState.CLAIMED, created_at=T0 + since, next_attempt_at=None, lease_token=3
    )
    t = after_lease_expiry(item, open_, T0)
    after = apply(item, t)
    assert (after.lease_owner, after.lease_expires_at, after.last_detail) == (
        None,
        None,
        "lease_expired",
    )
    if open_:
        assert (after.state, after.next_attempt_at) == (DeliveryState.UNKNOWN, None)
        assert after.last_failure_class is FailureClass.UNKNOWN
    else:
        assert (after.state, after.next_attempt_at) == (DeliveryState.RETRY_SCHEDULED, T0)


@given(
    claims(),
    histories(),
    st.sampled_from(LookupStatus),
    st.none() | st.integers(0, 3 * 86_400).map(lambda s: timedelta(seconds=s)),
    offsets,
    st.integers(0, 10 * 86_400).map(lambda s: timedelta(seconds=s)),
)
def test_an_unknown_item_moves_only_on_evidence(claim, history, status, window, close, idle):
    item = claim.item
    last_attempt = T0 - idle
    unknown = WorkItem(
        item.key,
        DeliveryState.UNKNOWN,
        created_at=item.created_at,
        next_attempt_at=None,
        first_attempt_at=item.first_attempt_at,
        last_attempt_at=last_attempt,
        replayed_at=item.replayed_at,
        lease_token=item.lease_token,
    )
    asked: list[bool] = []

    def lookup() -> LookupResult:
        asked.append(True)
        return LookupResult(status, "pm-found" if status is LookupStatus.FOUND else None)

    found = settle_unknown(
        unknown,
        history,
        lookup,
        mailer=MAILER,
        now=T0,
        closes_at=T0 + close,
        idempotency_window=window,
        policy=POLICY,
        actor="system:reconcile",
    )
    accepted = [a for a in history if a.outcome == "sent"]
    proves_not_sent = bool(history) and all(a.outcome in NOT_ACCEPTED for a in history)
    # the mailer is asked only when the ledger's own attempts settle nothing
    assert bool(asked) == (not accepted and not proves_not_sent)
    if found is None:
        assert not accepted
        assert not proves_not_sent
        assert status is LookupStatus.UNSUPPORTED
        assert idle < POLICY.unknown_retention
        return
    t, evidence = found
    assert (t.expected, t.token, t.at) == (DeliveryState.UNKNOWN, unknown.lease_token, T0)
    assert t.detail == f"reconciled:{evidence.value}"
    assert t.audit is not None
    assert t.audit.reason == f"evidence:{evidence.value}"
    after = apply(unknown, t)
    if after.state is DeliveryState.SENT:
        # sent only on a confirmation: the ledger's own, else the provider's
        assert evidence in (Evidence.LEDGER_ATTEMPT, Evidence.MAILER_LOOKUP_FOUND)
        assert after.provider_message_id == (
            accepted[-1].provider_message_id if accepted else "pm-found"
        )
    elif after.state is DeliveryState.RETRY_SCHEDULED:
        assert after.next_attempt_at == T0
        if evidence is Evidence.IDEMPOTENT_RESEND:
            # a resend only while the provider still remembers the first send, with a lease of
            # margin, and never once the delivery window has closed (except for a replay)
            assert window is not None
            assert item.first_attempt_at is not None
            assert t.resend_until == after.dedupe_until == item.first_attempt_at + window
            assert after.dedupe_until is not None
            assert T0 + POLICY.lease < after.dedupe_until
            assert unknown.replayed_at is not None or close > timedelta(0)
        else:
            assert evidence in (
                Evidence.LEDGER_ATTEMPTS_NOT_ACCEPTED,
                Evidence.MAILER_LOOKUP_NOT_FOUND,
            )
            assert t.has(ClearDedupe)
            assert not t.has(ResendUntil)
    else:
        assert after.state is DeliveryState.DEAD_LETTERED
        assert evidence is Evidence.UNKNOWN_UNRESOLVED
        assert t.dead_letter_reason == "unknown_unresolved"
        assert idle >= POLICY.unknown_retention


@given(st.sampled_from(DeliveryState), maybe_offsets, st.integers(0, 9), offsets)
def test_only_a_due_item_is_claimed_and_each_claim_takes_the_next_token(state, due, token, since):
    item = WorkItem(
        key_of(1),
        state,
        created_at=T0 + since,
        next_attempt_at=None if due is None else T0 + due,
        lease_token=token,
    )
    if not is_due(item, T0):
        with pytest.raises(LostRace):
            claimed(item, "w", T0, POLICY.lease)
        return
    claim = claimed(item, "w", T0, POLICY.lease)
    assert (claim.token, claim.item.lease_token) == (token + 1, token + 1)
    assert (claim.item.state, claim.item.next_attempt_at) == (DeliveryState.CLAIMED, None)
    assert claim.expires_at == claim.item.lease_expires_at == T0 + POLICY.lease
    started = attempt_started(claim, claim.item, T0)
    assert (started.attempts, started.budget_used) == (item.attempts + 1, item.budget_used + 1)
    # the lease has run out: the attempt must not start
    with pytest.raises(LostRace):
        attempt_started(claim, claim.item, T0 + POLICY.lease)


NOTE = AuditNote("alice", "test", "a reason")


@given(st.sampled_from(DeliveryState), st.integers(0, 12), maybe_offsets, st.booleans())
def test_a_replay_reopens_with_a_fresh_budget_and_only_from_a_replayable_state(
    state, used, dedupe, was_replayed
):
    item = WorkItem(
        key_of(3),
        state,
        created_at=T0 - timedelta(days=1),
        next_attempt_at=None,
        attempts=used,
        budget_used=used,
        window_started_at=T0 - timedelta(hours=2),
        dedupe_until=None if dedupe is None else T0 + dedupe,
        replayed_at=T0 - timedelta(days=1) if was_replayed else None,
        lease_token=4,
    )
    move = replayed(item, T0, NOTE)
    if state not in REPLAYABLE:
        with pytest.raises(InvalidTransition):
            apply(item, move)
        return
    after = apply(item, move)
    assert (after.state, after.next_attempt_at, after.replayed_at) == (
        DeliveryState.PENDING,
        T0,
        T0,
    )
    # the attempt count is history and stays; the budget and the window start again
    assert (after.attempts, after.budget_used, after.window_started_at) == (used, 0, None)
    assert after.dedupe_until is None
    assert move.audit == NOTE


@given(st.sampled_from(DeliveryState), st.booleans(), maybe_offsets)
def test_an_operators_word_settles_only_an_unknown_item(state, sent, dedupe):
    item = WorkItem(
        key_of(4),
        state,
        created_at=T0 - timedelta(days=1),
        next_attempt_at=None,
        dedupe_until=None if dedupe is None else T0 + dedupe,
        lease_token=2,
    )
    if state is not DeliveryState.UNKNOWN:
        with pytest.raises(ResolveRefused, match="only unknown items can be resolved"):
            resolved(item, sent, T0, NOTE)
        return
    after = apply(item, resolved(item, sent, T0, NOTE))
    if sent:
        assert (after.state, after.sent_at, after.next_attempt_at) == (DeliveryState.SENT, T0, None)
        assert after.dedupe_until == item.dedupe_until
    else:
        # a resend on the operator's word needs no deduplication window: it was not sent
        assert (after.state, after.next_attempt_at) == (DeliveryState.RETRY_SCHEDULED, T0)
        assert after.dedupe_until is None
        assert after.sent_at is None
