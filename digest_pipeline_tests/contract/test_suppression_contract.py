"""The suppression list contract, over the fake, SQLite and PostgreSQL ledgers.

A suppression is recorded once, with an audit row, and ends the customer's items of every week
whose attempt has not started (unclaimed, or claimed and not yet attempted) as `suppressed` in
the same step; an item whose attempt started (in flight) or that was sent is left as it is.
`cancel_suppressed` catches the items enqueued after the suppression, and the start of an
attempt checks the list in its own transaction.
"""

from dataclasses import replace
from datetime import datetime, timedelta

from digest_pipeline.domain.feedback import Suppression, SuppressionReason
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.ports import Ledger
from digest_pipeline_tests.builders import (
    TEST_MAILER,
    deliver_all,
    failed_invariants,
    key_of,
    make_deliverer,
    seed_period,
    start_one,
)
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.fakes import FakeMailer

W43 = Period(2026, 43)
LEASE = timedelta(minutes=5)


def _suppression(
    n: int, at: datetime, reason: SuppressionReason = SuppressionReason.UNSUBSCRIBED
) -> Suppression:
    return Suppression(key_of(n).customer_id, reason, "one_click", at)


def _states(ledger: Ledger, period: Period) -> dict[OperationKey, DeliveryState]:
    return {i.key: i.state for i in ledger.items(period)}


def test_a_suppression_cancels_every_item_whose_attempt_has_not_started(ledger, clock):
    seed_period(ledger, 3, now=clock.now())
    deliver_all(make_deliverer(ledger, FakeMailer(clock=clock), clock), period=W42)
    seed_period(ledger, 4, period=W43, now=clock.now())
    in_flight, unstarted = ledger.claim_due(clock.now(), "w1", LEASE, 2, W43)
    assert (in_flight.item.key, unstarted.item.key) == (key_of(1, W43), key_of(2, W43))
    start_one(ledger, in_flight, clock.now())

    for n in (1, 2, 3):
        assert ledger.suppress(_suppression(n, clock.now())) is True

    sent = DeliveryState.SENT
    assert _states(ledger, W42) == {key_of(1): sent, key_of(2): sent, key_of(3): sent}
    assert _states(ledger, W43) == {
        key_of(1, W43): DeliveryState.CLAIMED,  # in flight: its worker finishes it
        key_of(2, W43): DeliveryState.SUPPRESSED,  # claimed, but no attempt had started
        key_of(3, W43): DeliveryState.SUPPRESSED,
        key_of(4, W43): DeliveryState.PENDING,
    }
    assert ledger.suppressed_ids() == {key_of(n).customer_id for n in (1, 2, 3)}
    moves = [(e.key, e.from_state, e.to_state) for e in ledger.audit_log(W43)]
    assert moves == [
        (key_of(2, W43), DeliveryState.CLAIMED, DeliveryState.SUPPRESSED),
        (key_of(3, W43), DeliveryState.PENDING, DeliveryState.SUPPRESSED),
    ]
    listed = [(e.action, e.actor, e.reason) for e in ledger.audit_log() if e.key is None]
    assert listed == [
        ("suppress", "one_click", f"{key_of(n).customer_id}: unsubscribed") for n in (1, 2, 3)
    ]
    assert failed_invariants(ledger, W43, clock.now()) == []


def test_no_attempt_starts_for_a_claim_whose_customer_was_suppressed_after_the_claim(ledger, clock):
    """The race: claimed, then suppressed, then the worker starts its wave."""
    seed_period(ledger, 3, now=clock.now())
    claims = ledger.claim_due(clock.now(), "w1", LEASE, 3, W42)
    # the customer unsubscribes while the claimed wave waits for its turn
    assert ledger.suppress(_suppression(2, clock.now())) is True

    started = ledger.start_attempts(claims, clock.now(), mailer=TEST_MAILER)

    assert [type(s).__name__ for s in started] == ["AttemptTicket", "LostRace", "AttemptTicket"]
    assert ledger.attempts(key_of(2)) == []
    assert ledger.get(key_of(2)).state is DeliveryState.SUPPRESSED
    assert [a.mailer for k in (1, 3) for a in ledger.attempts(key_of(k))] == [TEST_MAILER] * 2


def test_the_start_of_an_attempt_checks_the_list_in_its_own_transaction(ledger, clock):
    """A customer on the list before their item was enqueued and claimed: nothing cancelled it
    yet (no sweep ran between), so only the start's own check stands between it and a send."""
    ledger.suppress(_suppression(2, clock.now()))
    seed_period(ledger, 3, now=clock.now())
    claims = ledger.claim_due(clock.now(), "w1", LEASE, 3, W42)
    assert [c.key for c in claims] == [key_of(1), key_of(2), key_of(3)]

    started = ledger.start_attempts(claims, clock.now(), mailer=TEST_MAILER)

    assert [type(s).__name__ for s in started] == ["AttemptTicket", "LostRace", "AttemptTicket"]
    assert ledger.attempts(key_of(2)) == []
    assert ledger.get(key_of(2)).state is DeliveryState.SUPPRESSED
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_a_delivery_run_sends_nothing_to_a_customer_suppressed_after_the_claim(ledger, clock):
    seed_period(ledger, 3, now=clock.now())
    mailer = FakeMailer(clock=clock)
    deliverer = make_deliverer(ledger, mailer, clock)
    claims = ledger.claim_due(clock.now(), "w1", LEASE, 3, W42)
    ledger.suppress(_suppression(2, clock.now()))

    states = [deliverer.deliver_one(c) for c in claims]

    assert states == [DeliveryState.SENT, DeliveryState.SUPPRESSED, DeliveryState.SENT]
    assert key_of(2) not in {m.key for m in mailer.sent_messages}
    assert ledger.attempts(key_of(2)) == []
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_the_first_suppression_wins_and_a_second_writes_nothing(ledger, clock):
    first = _suppression(1, clock.now())
    assert ledger.suppress(first) is True
    audit = ledger.audit_log()
    later = replace(first, reason=SuppressionReason.COMPLAINT, source="provider:resend:msg_9")
    assert ledger.suppress(later, "again") is False
    assert ledger.suppressions() == [first]
    assert ledger.audit_log() == audit


def test_items_enqueued_after_a_suppression_are_cancelled_before_delivery(ledger, clock):
    ledger.suppress(_suppression(2, clock.now()))
    # a snapshot frozen without the gate (or before the suppression) still holds customer 2
    seed_period(ledger, 3, now=clock.now())
    assert _states(ledger, W42)[key_of(2)] is DeliveryState.PENDING

    assert ledger.cancel_suppressed(clock.now(), W43) == []
    assert ledger.cancel_suppressed(clock.now(), W42) == [key_of(2)]
    assert ledger.cancel_suppressed(clock.now(), W42) == []
    assert ledger.cancel_suppressed(clock.now()) == []
    assert _states(ledger, W42)[key_of(2)] is DeliveryState.SUPPRESSED


def test_unsuppressing_is_audited_and_leaves_cancelled_items_cancelled(ledger, clock):
    seed_period(ledger, 2, now=clock.now())
    ledger.suppress(_suppression(2, clock.now(), SuppressionReason.OPERATOR), "asked to stop")
    clock.advance(timedelta(hours=1))

    assert ledger.unsuppress(key_of(2).customer_id, clock.now(), "operator:ana", "mistake")
    assert ledger.unsuppress(key_of(2).customer_id, clock.now(), "operator:ana", "again") is False

    assert ledger.suppressions() == []
    assert ledger.suppressed_ids() == frozenset()
    assert _states(ledger, W42)[key_of(2)] is DeliveryState.SUPPRESSED
    listed = [(e.action, e.actor, e.reason) for e in ledger.audit_log() if e.key is None]
    customer = key_of(2).customer_id
    assert listed == [
        ("suppress", "one_click", f"{customer}: operator: asked to stop"),
        ("unsuppress", "operator:ana", f"{customer}: mistake"),
    ]
