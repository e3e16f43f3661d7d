"""The feedback store contract, run unchanged over the fake, SQLite and PostgreSQL.

One suppression per customer (first reason wins), one event per (provider, event id) however
many threads record it, the `received` lease taken over once, and the reads `digest serve` needs
(known customers, the attempt a provider message id names). The service and HTTP tests rely on
the fake behaving as the SQL store does; this is where that is held.
"""

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, timedelta

import pytest
from sqlalchemy import Engine, insert

from digest_pipeline.adapters.sql.feedback import SqlFeedbackStore
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.adapters.sql.schema import customers
from digest_pipeline.domain.feedback import (
    ClaimStatus,
    EventOutcome,
    EventRecord,
    EventType,
    Suppression,
    SuppressionReason,
)
from digest_pipeline.ports import FeedbackStore, Ledger
from digest_pipeline_tests.builders import deliver_all, key_of, make_deliverer, seed_period
from digest_pipeline_tests.conftest import BACKENDS, T0
from digest_pipeline_tests.fakes import FakeLedger, FakeMailer, FixedClock
from digest_pipeline_tests.feedback_fakes import FakeFeedbackStore

#: a customer the shop's source holds but no snapshot has selected
SOURCE_ONLY = "customer-9001"
LEASE = timedelta(seconds=60)


@dataclass
class Stores:
    store: FeedbackStore
    ledger: Ledger


@pytest.fixture(params=BACKENDS)
def stores(request: pytest.FixtureRequest, sql_engine_factory: Callable[[str], Engine]) -> Stores:
    seeded: Ledger
    if request.param == "fake":
        seeded = FakeLedger()
        seed_period(seeded, 3)
        return Stores(FakeFeedbackStore(seeded, customers=[SOURCE_ONLY]), seeded)
    engine = sql_engine_factory(request.param)
    with engine.begin() as conn:
        conn.execute(
            insert(customers).values(
                customer_id=SOURCE_ONLY,
                email="source.only@mailbox.example",
                active=True,
                opted_in=False,
                created_at=T0,
            )
        )
    seeded = SqlLedger(engine)
    seed_period(seeded, 3)
    return Stores(SqlFeedbackStore(engine), seeded)


def record(event_id: str = "msg_1", provider: str = "resend", at=T0, **fields) -> EventRecord:
    values = {
        "provider": provider,
        "event_id": event_id,
        "type": EventType.DELIVERED,
        "operation_key": key_of(1),
        "provider_message_id": "msg-1",
        "received_at": at,
        "outcome": EventOutcome.RECEIVED,
        **fields,
    }
    return EventRecord(**values)


def test_a_customer_is_known_from_a_snapshot_or_the_source_only(stores):
    store = stores.store
    assert store.known_customer("customer-0001")  # selected in 2026-W42
    assert store.known_customer(SOURCE_ONLY)  # in the source, never selected
    assert not store.known_customer("customer-0404")
    assert not store.known_customer("")
    assert not store.known_customer("x' OR '1'='1")


def test_a_customer_is_suppressed_once_and_the_first_reason_wins(stores):
    store = stores.store
    first = Suppression("customer-0002", SuppressionReason.UNSUBSCRIBED, "one_click", T0)
    later = Suppression(
        "customer-0002", SuppressionReason.COMPLAINT, "provider:resend:msg_9", T0 + timedelta(1)
    )
    assert store.suppress(first)
    assert not store.suppress(later)
    assert store.suppress(Suppression("customer-0001", SuppressionReason.HARD_BOUNCE, "x", T0))
    assert [(s.customer_id, s.reason) for s in store.suppressions()] == [
        ("customer-0001", SuppressionReason.HARD_BOUNCE),
        ("customer-0002", SuppressionReason.UNSUBSCRIBED),
    ]
    kept = store.suppressions()[1]
    assert kept == first
    assert kept.created_at.tzinfo is UTC


def test_concurrent_suppressions_of_one_customer_record_it_once(stores):
    store, results = stores.store, []
    barrier = threading.Barrier(8)

    def one(n: int) -> None:
        barrier.wait()
        reason = SuppressionReason.UNSUBSCRIBED if n % 2 else SuppressionReason.COMPLAINT
        results.append(store.suppress(Suppression("customer-0003", reason, f"t{n}", T0)))

    threads = [threading.Thread(target=one, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 7 + [True]
    assert len(store.suppressions()) == 1


def test_a_provider_message_id_names_the_key_whose_attempt_got_it(stores):
    clock = FixedClock(T0)
    mailer = FakeMailer(clock=clock)
    deliver_all(make_deliverer(stores.ledger, mailer, clock))
    delivered = {k: pid for k, pid, _ in mailer.deliveries}
    assert len(delivered) == 3
    for key, pid in delivered.items():
        assert stores.store.key_of_provider_message(pid) == key_of(int(key[-4:]))
    assert stores.store.key_of_provider_message("msg-404") is None


def test_an_event_is_recorded_once_and_a_repeat_is_told_what_it_did(stores):
    store = stores.store
    assert store.begin_event(record(), LEASE).status is ClaimStatus.NEW
    # the same id while the first request still holds it: the provider retries later
    assert store.begin_event(record(at=T0 + timedelta(seconds=1)), LEASE).status is (
        ClaimStatus.IN_PROGRESS
    )
    store.finish_event("resend", "msg_1", EventOutcome.SETTLED_SENT)
    store.finish_event("resend", "msg_1", EventOutcome.CONFIRMED)  # only the first finish counts
    again = store.begin_event(record(at=T0 + timedelta(hours=1)), LEASE)
    assert (again.status, again.outcome) == (ClaimStatus.DONE, EventOutcome.SETTLED_SENT)
    # the id is the provider's: another provider's event of the same id is another event
    assert store.begin_event(record(provider="postmark"), LEASE).status is ClaimStatus.NEW
    stored = store.provider_events()
    assert [(e.provider, e.event_id, e.outcome) for e in stored] == [
        ("postmark", "msg_1", EventOutcome.RECEIVED),
        ("resend", "msg_1", EventOutcome.SETTLED_SENT),
    ]
    assert stored[1] == record(outcome=EventOutcome.SETTLED_SENT)


def test_an_abandoned_event_is_taken_over_once_after_its_lease(stores):
    store = stores.store
    assert store.begin_event(record(), LEASE).status is ClaimStatus.NEW
    # the first request died before it finished; the provider retries after the lease
    later = T0 + LEASE + timedelta(seconds=1)
    assert store.begin_event(record(at=later), LEASE).status is ClaimStatus.RESUMED
    assert store.begin_event(record(at=later), LEASE).status is ClaimStatus.IN_PROGRESS
    store.finish_event("resend", "msg_1", EventOutcome.CONFIRMED)
    assert [e.outcome for e in store.provider_events()] == [EventOutcome.CONFIRMED]
    assert store.provider_events()[0].received_at == later


def test_an_unmatched_event_is_stored_without_a_key(stores):
    store = stores.store
    store.begin_event(record("msg_2", operation_key=None, provider_message_id=None), LEASE)
    store.finish_event("resend", "msg_2", EventOutcome.UNMATCHED)
    (only,) = store.provider_events()
    assert (only.operation_key, only.provider_message_id, only.outcome) == (
        None,
        None,
        EventOutcome.UNMATCHED,
    )


def test_concurrent_deliveries_of_one_event_are_recorded_once(stores):
    store, statuses = stores.store, []
    barrier = threading.Barrier(8)

    def one() -> None:
        barrier.wait()
        statuses.append(store.begin_event(record("msg_3"), LEASE).status)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert Counter(statuses) == {ClaimStatus.NEW: 1, ClaimStatus.IN_PROGRESS: 7}
    assert len(store.provider_events()) == 1
