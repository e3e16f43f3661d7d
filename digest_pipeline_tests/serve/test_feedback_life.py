"""Two weeks of life with `digest serve` answering: the loop closes on the next week's snapshot.

Week 42 goes out to five customers; the worker's answer for customer 4 is lost (`unknown`).
During week 43, customer 2 unsubscribes by the one-click POST, the provider's signed webhooks
say 4's digest was delivered and 3 complained. Week 42's metrics count them; week 43's snapshot
leaves 2 and 3 out; 5, who unsubscribes after week 43 froze, has that week's item cancelled.
Over both weeks no digest reaches a customer after their suppression, and none goes twice.
"""

from collections.abc import Callable
from datetime import timedelta

import pytest
from sqlalchemy import Engine

from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.rigs.servers.resend_events import webhook_payload
from digest_pipeline.services.enqueue import enqueue_period
from digest_pipeline.services.metrics import period_metrics
from digest_pipeline.services.snapshot import take_snapshot
from digest_pipeline_tests.builders import (
    ROWS_PER_CUSTOMER,
    customer_id,
    deliver_all,
    digest_rows_for,
    failed_invariants,
    key_of,
    make_customer,
    make_deliverer,
)
from digest_pipeline_tests.conftest import SQL_BACKENDS, T0, W42
from digest_pipeline_tests.fakes import FakeCustomerSource, FakeMailer, FixedClock
from digest_pipeline_tests.serve.conftest import ONE_CLICK, ONE_CLICK_BODY, link, running

W43 = Period(2026, 43)
SHOP = FakeCustomerSource([make_customer(n) for n in range(1, 6)])


def _freeze(ledger: SqlLedger, clock: FixedClock, period: Period) -> set[str]:
    """The week's snapshot, content and items; returns who was selected."""
    take_snapshot(SHOP, ledger, clock, period, f"run-{period}")
    selected = {e.customer_id for e in ledger.snapshot_entries(period)}
    numbers = [n for n in range(1, 6) if customer_id(n) in selected]
    ledger.add_digest_rows(
        row for n in numbers for row in digest_rows_for(key_of(n, period), n, ROWS_PER_CUSTOMER)
    )
    enqueue_period(ledger, clock, period)
    return selected


@pytest.fixture(params=SQL_BACKENDS)
def engine(request: pytest.FixtureRequest, sql_engine_factory: Callable[[str], Engine]) -> Engine:
    return sql_engine_factory(request.param)


def test_an_unsubscribe_and_the_providers_events_shape_the_next_week(engine: Engine):
    ledger, clock = SqlLedger(engine), FixedClock(T0)
    mailer = FakeMailer(clock=clock, can_lookup=False)
    mailer.script_timeout_after_accept(key_of(4))
    assert _freeze(ledger, clock, W42) == {customer_id(n) for n in range(1, 6)}
    deliver_all(make_deliverer(ledger, mailer, clock), period=W42)
    assert ledger.get(key_of(4)).state is DeliveryState.UNKNOWN  # type: ignore[union-attr]
    ids = {k: pid for k, pid, _ in mailer.deliveries}

    with running(engine, clock, mailer) as site:
        clock.advance(timedelta(days=1))
        unsubscribed = site.http.post(
            link(customer_id(2)), content=ONE_CLICK_BODY, headers=ONE_CLICK
        )
        settled = site.post_event(webhook_payload("email.delivered", key=key_of(4)), "e-1")
        complained = site.post_event(
            webhook_payload("email.complained", message_id=ids[str(key_of(3))]), "e-2"
        )
        assert unsubscribed.status_code == 200
        assert settled.json() == {"outcome": "settled_sent"}
        assert complained.json() == {"outcome": "suppressed"}

        week_42 = period_metrics(ledger, W42, clock.now())
        assert week_42.by_state[DeliveryState.SENT.value] == 5
        feedback = week_42.feedback
        assert (feedback.unsubscribes, feedback.complaints, feedback.hard_bounces) == (1, 1, 0)
        assert week_42.complaint_rate == 1 / 5

        clock.advance(timedelta(days=6))  # week 43 is over: its digest is due
        assert _freeze(ledger, clock, W43) == {customer_id(n) for n in (1, 4, 5)}
        site.http.post(link(customer_id(5)), content=ONE_CLICK_BODY, headers=ONE_CLICK)
    deliver_all(make_deliverer(ledger, mailer, clock), period=W43)

    states = {i.key.customer_id: i.state for i in ledger.items(W43)}
    assert states == {
        customer_id(1): DeliveryState.SENT,
        customer_id(4): DeliveryState.SENT,
        customer_id(5): DeliveryState.SUPPRESSED,
    }
    sent_to = sorted(str(m.key) for m in mailer.sent_messages)
    assert sent_to == sorted(
        [str(key_of(n)) for n in range(1, 6)] + [str(key_of(n, W43)) for n in (1, 4)]
    )
    assert mailer.duplicate_deliveries == 0
    for period in (W42, W43):
        assert failed_invariants(ledger, period, clock.now()) == []
