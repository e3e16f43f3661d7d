"""A suppressed customer gets no digest: left out of later snapshots, cancelled in the current one.

The eligibility gate reads the suppression list before the source; a snapshot frozen before a
suppression keeps its meaning (the entry stays), and the delivery run cancels the customer's
never-claimed item to `suppressed` instead of sending it. The invariant: no message is ever
handed to the mailer for a customer on the list at claim time.
"""

from datetime import timedelta

import pytest

from digest_pipeline.domain.feedback import Suppression, SuppressionReason
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.ports import Ledger
from digest_pipeline.services.enqueue import enqueue_period
from digest_pipeline.services.snapshot import take_snapshot
from digest_pipeline_tests.builders import (
    customer_id,
    deliver_all,
    failed_invariants,
    make_customer,
    make_deliverer,
)
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.fakes import FakeCustomerSource, FakeLedger, FakeMailer, FixedClock

# every test here on both delivery loops: a provider's pool and a local mailer's ledger thread
pytestmark = pytest.mark.usefixtures("both_mailer_kinds")

W43 = Period(2026, 43)


def _suppress(
    ledger: Ledger,
    n: int,
    clock: FixedClock,
    reason: SuppressionReason = SuppressionReason.UNSUBSCRIBED,
) -> None:

    assert ledger.suppress(Suppression(customer_id(n), reason, "one_click", clock.now()))


def test_the_gate_leaves_suppressed_customers_out_and_counts_them(clock):
    ledger = FakeLedger()
    source = FakeCustomerSource([make_customer(n) for n in range(1, 6)])
    _suppress(ledger, 2, clock)
    _suppress(ledger, 4, clock, SuppressionReason.HARD_BOUNCE)

    report = take_snapshot(source, ledger, clock, W42, "run-1")

    assert (report.eligible, report.suppressed, report.considered) == (3, 2, 5)
    assert [e.customer_id for e in ledger.snapshot_entries(W42)] == [
        customer_id(1),
        customer_id(3),
        customer_id(5),
    ]


def test_a_frozen_week_keeps_its_entry_and_its_unsent_item_is_cancelled_not_sent(clock):
    ledger = FakeLedger()
    source = FakeCustomerSource([make_customer(n) for n in range(1, 4)])
    take_snapshot(source, ledger, clock, W42, "run-1")
    enqueue_period(ledger, clock, W42)
    _suppress(ledger, 3, clock)  # after the freeze: the entry stays
    take_snapshot(source, ledger, clock, W42, "run-2")
    assert customer_id(3) in {e.customer_id for e in ledger.snapshot_entries(W42)}

    mailer = FakeMailer(clock=clock)
    report = deliver_all(make_deliverer(ledger, mailer, clock), period=W42)

    assert {m.key.customer_id for m in mailer.sent_messages} == {customer_id(1), customer_id(2)}
    states = {i.key.customer_id: i.state for i in ledger.items(W42)}
    assert states[customer_id(3)] is DeliveryState.SUPPRESSED
    assert report.suppressed == 0  # the suppression itself cancelled the pending item
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_an_item_enqueued_after_the_suppression_is_cancelled_by_the_delivery_run(clock):
    ledger = FakeLedger()
    source = FakeCustomerSource([make_customer(n) for n in range(1, 4)])
    take_snapshot(source, ledger, clock, W42, "run-1")
    _suppress(ledger, 1, clock)  # frozen, not yet enqueued
    enqueue_period(ledger, clock, W42)
    mailer = FakeMailer(clock=clock)

    report = deliver_all(make_deliverer(ledger, mailer, clock), period=W42)

    assert report.suppressed == 1
    assert customer_id(1) not in {m.key.customer_id for m in mailer.sent_messages}
    states = {i.key.customer_id: i.state for i in ledger.items(W42)}
    assert states[customer_id(1)] is DeliveryState.SUPPRESSED
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_next_week_leaves_them_out_and_an_unsuppressed_customer_comes_back(clock):
    ledger = FakeLedger()
    source = FakeCustomerSource([make_customer(n) for n in range(1, 4)])
    _suppress(ledger, 2, clock)
    take_snapshot(source, ledger, clock, W42, "run-42")
    clock.advance(timedelta(weeks=1))
    ledger.unsuppress(customer_id(2), clock.now(), "operator:ana", "asked to come back")

    take_snapshot(source, ledger, clock, W43, "run-43")

    assert customer_id(2) not in {e.customer_id for e in ledger.snapshot_entries(W42)}
    assert customer_id(2) in {e.customer_id for e in ledger.snapshot_entries(W43)}
