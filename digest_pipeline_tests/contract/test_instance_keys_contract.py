"""A ledger of digest instance `vip_digest` makes only `vip_digest:` keys, over the fake and SQL.

A week snapshotted, given content, enqueued and delivered through the outbox with the product
composer: every work item, row, attempt and audit row, every Idempotency-Key and key header the
mailer sees and every outbox file name carry the instance, none the default's, and every
Message-ID is another than the default instance's key would get. Two instances on one provider
account so never deduplicate each other's digests away; and a week's bounce count holds only the
instance's own keys, though its endpoint records the other instance's events too.
"""

from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine

from digest_pipeline.adapters.mail.outbox import OutboxMailer, stored_key
from digest_pipeline.adapters.mail.render import Jinja2Composer
from digest_pipeline.adapters.sql.feedback import SqlFeedbackStore
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.domain.catalogue import Order, Product
from digest_pipeline.domain.failures import SendOutcome
from digest_pipeline.domain.feedback import EventOutcome, EventRecord, EventType
from digest_pipeline.domain.model import Message
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.ports import FeedbackStore, Ledger
from digest_pipeline.services.content import generate_content
from digest_pipeline.services.enqueue import enqueue_period
from digest_pipeline.services.snapshot import take_snapshot
from digest_pipeline.wiring import ledger_on
from digest_pipeline_tests.builders import (
    customer_id,
    deliver_all,
    failed_invariants,
    make_customer,
    make_deliverer,
)
from digest_pipeline_tests.conftest import BACKENDS, T0, W42
from digest_pipeline_tests.fakes import FakeCustomerSource, FakeLedger, FixedClock, WrappingMailer
from digest_pipeline_tests.feedback_fakes import FakeFeedbackStore

VIP = "vip_digest"
CUSTOMERS = 3
OLD = W42.starts_at - timedelta(days=300)


class RecordingMailer(WrappingMailer):
    """Sends through the inner mailer and keeps each (Idempotency-Key, message) it was given."""

    def __init__(self, inner: OutboxMailer) -> None:
        super().__init__(inner)
        self.sent: list[tuple[str, Message]] = []

    def send(self, message: Message, *, idempotency_key: str) -> SendOutcome:
        self.sent.append((idempotency_key, message))
        return self._inner.send(message, idempotency_key=idempotency_key)


@pytest.fixture(params=BACKENDS)
def vip_ledger(
    request: pytest.FixtureRequest, sql_engine_factory: Callable[[str], Engine]
) -> Ledger:
    if request.param == "fake":
        return FakeLedger(VIP)
    return ledger_on(sql_engine_factory(request.param), VIP, now=T0)


def shop() -> FakeCustomerSource:
    products = [
        Product(
            f"p-{n}", f"Board {n}", "Kitchen", 1250, "EUR", f"https://shop.example/p/{n}", None, OLD
        )
        for n in range(1, 5)
    ]
    orders = [Order("order-1", customer_id(1), "p-1", W42.starts_at - timedelta(days=3))]
    customers = [make_customer(n) for n in range(1, CUSTOMERS + 1)]
    return FakeCustomerSource(customers, products, orders)


def composer(clock: FixedClock) -> Jinja2Composer:
    return Jinja2Composer(
        sender="digest@shop.example",
        unsubscribe_url="https://shop.example/unsubscribe/{customer_id}?token={token}",
        unsubscribe_secret="a-private-secret-for-tests",
        clock=clock,
    )


def header(message: Message, name: str) -> str:
    (value,) = [v for n, v in message.headers if n.lower() == name.lower()]
    return value


def test_a_week_of_another_instance_carries_its_name_everywhere(
    vip_ledger: Ledger, clock: FixedClock, tmp_path: Path
):
    source, outbox = shop(), OutboxMailer(tmp_path / "outbox")
    mailer, compose = RecordingMailer(outbox), composer(clock)

    take_snapshot(source, vip_ledger, clock, W42, "run-1")
    first = generate_content(source, vip_ledger, W42)
    again = generate_content(source, vip_ledger, W42)
    enqueue_period(vip_ledger, clock, W42)
    deliver_all(make_deliverer(vip_ledger, mailer, clock, composer=compose))

    expected = {OperationKey(W42, customer_id(n), VIP) for n in range(1, CUSTOMERS + 1)}
    items = vip_ledger.items(W42)
    assert {i.key for i in items} == expected
    assert {i.state for i in items} == {DeliveryState.SENT}
    # the rows were found under the instance's keys: the second pass had nothing to write
    assert (first.customers, again.customers) == (CUSTOMERS, 0)
    assert vip_ledger.keys_with_rows(W42) == expected
    attempts = [a for k in expected for a in vip_ledger.attempts(k)]
    assert {a.key for a in attempts} == expected
    assert {e.key for e in vip_ledger.audit_log(W42) if e.key is not None} <= expected

    texts = [str(k) for k in expected]
    assert sorted(key for key, _ in mailer.sent) == sorted(texts)
    assert sorted(header(m, "X-Digest-Operation-Key") for _, m in mailer.sent) == sorted(texts)
    files = sorted(p.name for p in outbox.stored())
    assert files == sorted(f"{VIP}_{W42}_{customer_id(n)}.eml" for n in range(1, CUSTOMERS + 1))
    assert sorted(stored_key(p) or "" for p in outbox.stored()) == sorted(texts)
    seen = [*texts, *(k for k, _ in mailer.sent), *files]
    assert not [s for s in seen if s.startswith(("digest:", "digest_"))]
    for _, message in mailer.sent:
        default_key = OperationKey(W42, message.key.customer_id)
        stored = vip_ledger.get(message.key)
        assert stored is not None
        item = replace(stored, key=default_key)
        rows = vip_ledger.digest_rows_of([message.key])[message.key]
        default_rows = [replace(r, key=default_key) for r in rows]
        default = compose.compose(item, message.recipient, default_rows)
        assert header(message, "Message-ID") != header(default, "Message-ID")
    assert failed_invariants(vip_ledger, W42, clock.now()) == []


def test_a_weeks_feedback_counts_only_the_instances_own_keys(vip_ledger: Ledger):
    store: FeedbackStore
    if isinstance(vip_ledger, FakeLedger):
        store = FakeFeedbackStore(vip_ledger)
    else:
        assert isinstance(vip_ledger, SqlLedger)
        store = SqlFeedbackStore(vip_ledger.engine, vip_ledger.instance)
    ours = [OperationKey(W42, customer_id(n), VIP) for n in (1, 2)]
    # the default instance's event on the same account reaches this endpoint too, unmatched
    theirs = OperationKey(W42, customer_id(3))
    events = [*((k, EventOutcome.SUPPRESSED) for k in ours), (theirs, EventOutcome.UNMATCHED)]
    for n, (key, outcome) in enumerate(events):
        record = EventRecord(
            "resend", f"msg_{n}", EventType.HARD_BOUNCE, key, None, T0, EventOutcome.RECEIVED
        )
        store.begin_event(record, timedelta(seconds=60))
        store.finish_event("resend", f"msg_{n}", outcome)

    assert vip_ledger.feedback_counts(W42).hard_bounces == len(ours)
