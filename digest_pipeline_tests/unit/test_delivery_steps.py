"""One claim's two delivery steps (`domain/delivery.py`), by property: what may be sent, what is recorded."""

from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from digest_pipeline.domain.delivery import (
    SNAPSHOT_TAMPERED,
    GiveBack,
    Instead,
    PeriodFacts,
    Send,
    after_send,
    before_attempt,
)
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.feedback import SuppressionReason
from digest_pipeline.domain.retry import DeadLetterReason
from digest_pipeline.domain.states import DeliveryState
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

OTHER_MAILER = "http:fedcba9876543210"
mailers = st.sampled_from([MAILER, OTHER_MAILER])


@given(
    claims(),
    histories(mailers),
    mailers,
    offsets,
    st.none() | st.just("refused"),
)
def test_a_claim_is_sent_only_when_nothing_the_ledger_holds_forbids_it(
    claim, history, mailer, close, refusal
):
    facts = PeriodFacts(T0, T0 + close, refusal)
    step = before_attempt(claim, facts, history, mailer, T0, POLICY, "reconcile")
    item = claim.item
    if refusal is not None:
        # a changed snapshot fences every claim of the period, whatever else holds
        assert step == GiveBack(SNAPSHOT_TAMPERED)
        return
    confirmed = any(a.outcome == "sent" for a in history)
    closed = item.replayed_at is None and facts.closes_at <= T0
    dedupe_gone = item.dedupe_until is not None and (
        closed or T0 + POLICY.lease >= item.dedupe_until
    )
    # an attempt still open, or closed `unknown`, may have left through its own mailer
    may_have_left = {None, FailureClass.UNKNOWN.value}
    foreign = item.dedupe_until is not None and any(
        a.mailer != mailer and a.outcome in may_have_left for a in history
    )
    if isinstance(step, Send):
        assert [confirmed, closed, dedupe_gone, foreign] == [False] * 4
        assert step.closes_at == (None if item.replayed_at is not None else facts.closes_at)
        return
    assert isinstance(step, Instead)
    assert confirmed or closed or dedupe_gone or foreign
    t = step.transition
    # every move instead of a send is guarded by the claim it replaces
    assert (t.key, t.expected, t.token) == (item.key, DeliveryState.CLAIMED, claim.token)
    if dedupe_gone:
        assert (t.target, t.detail) == (DeliveryState.UNKNOWN, "dedupe_window_passed")
    elif closed:
        assert (t.target, t.detail) == (
            DeliveryState.DEAD_LETTERED,
            DeadLetterReason.WINDOW_CLOSED.value,
        )
    elif confirmed:
        # a late confirmation in the ledger is recorded, never resent
        assert t.target is DeliveryState.SENT
    else:
        assert t.target is DeliveryState.UNKNOWN
        assert t.detail == f"needs_mailer:{OTHER_MAILER if mailer == MAILER else MAILER}"


hard_bounces = st.builds(
    SendOutcome.failed,
    st.just(FailureClass.PERMANENT),
    st.sampled_from(["smtp:550:5.1.1", "smtp:550:5.2.1", "smtp:550:5.7.1", "smtp:552:5.2.2"]),
)


@given(claims(), outcomes | hard_bounces, maybe_offsets)
def test_an_outcome_suppresses_its_customer_only_for_a_refused_mailbox(claim, outcome, close):
    closes_at = None if close is None else T0 + close
    after = after_send(
        claim,
        outcome,
        started_at=T0 - timedelta(seconds=5),
        closes_at=closes_at,
        now=T0,
        policy=POLICY,
        rand=lambda: 0.5,
    )
    mailbox_refused = outcome.failure_class is FailureClass.PERMANENT and outcome.detail in {
        "smtp:550:5.1.1",
        "smtp:550:5.2.1",
    }
    if mailbox_refused:
        assert after.suppression is not None
        assert after.suppression.customer_id == claim.key.customer_id
        assert after.suppression.reason is SuppressionReason.HARD_BOUNCE
    else:
        assert after.suppression is None
    assert after.outcome == outcome
    assert after.transition.token == claim.token
    assert after.routine == (
        after.transition.target is DeliveryState.SENT and not outcome.duplicate
    )
