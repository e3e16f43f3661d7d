"""What the services log during a full mixed run: operation keys, never addresses or content."""

import logging
import re
from datetime import timedelta

import pytest

from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import CleanupMode, Customer, Message
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.services.cleanup import clean_period
from digest_pipeline.services.deliver import deliver_due
from digest_pipeline.services.enqueue import enqueue_period
from digest_pipeline.services.metrics import period_metrics
from digest_pipeline.services.pipeline import sweep
from digest_pipeline.services.reconcile import reconcile_period
from digest_pipeline.services.replay import replay_keys
from digest_pipeline.services.resolve import resolve_unknown
from digest_pipeline.services.snapshot import take_snapshot
from digest_pipeline_tests.builders import (
    customer_id,
    digest_rows_for,
    failed_invariants,
    key_of,
    make_customer,
    make_deliverer,
    row_title,
)
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.fakes import (
    FakeComposer,
    FakeCustomerSource,
    FakeLedger,
    FakeMailer,
    FixedClock,
)

COUNT = 40
#: events about a whole period or run; every other event is about one item
PERIOD_EVENTS = frozenset(
    {"snapshot_frozen", "snapshot_reused", "enqueued", "sweep", "delivered", "cleaned"}
)
INVALID = Customer("bad id", "invalid.id.owner@mailbox.example", True, True)


class RaisesOnceMailer(FakeMailer):
    """A provider whose client library raises once for one key (and then behaves)."""

    def __init__(self, raise_for: str, clock: FixedClock) -> None:
        super().__init__(clock=clock)
        self._raise_for: str | None = raise_for

    def send(self, message: Message, *, idempotency_key: str) -> SendOutcome:
        if idempotency_key == self._raise_for:
            self._raise_for = None
            raise ConnectionResetError(f"reset while sending to {message.recipient}")
        return super().send(message, idempotency_key=idempotency_key)


def full_mixed_run(clock: FixedClock) -> tuple[FakeLedger, list[Customer]]:
    """Every service over one period: each failure class, a lost race, reconcile, resolve,
    replay, sweep, cleanup and metrics."""
    customers = [
        make_customer(n, active=n % 13 != 0, opted_in=n % 17 != 0) for n in range(1, COUNT + 1)
    ] + [INVALID]
    source, ledger = FakeCustomerSource(customers), FakeLedger()
    take_snapshot(source, ledger, clock, W42, "run-1")
    take_snapshot(source, ledger, clock, W42, "run-2")
    for entry in ledger.snapshot_entries(W42):
        n = int(entry.customer_id.removeprefix("customer-"))
        ledger.add_digest_rows(digest_rows_for(key_of(n), n))
    enqueue_period(ledger, clock, W42)

    mailer = RaisesOnceMailer(str(key_of(6)), clock=clock)
    mailer.script(key_of(1), SendOutcome.failed(FailureClass.TRANSIENT, "smtp:421"))
    mailer.script(
        key_of(2),
        SendOutcome.failed(FailureClass.THROTTLED, "http:429", retry_after=timedelta(seconds=40)),
    )
    mailer.script(key_of(3), SendOutcome.failed(FailureClass.PERMANENT, "smtp:550"))
    mailer.script_timeout_after_accept(key_of(4))
    mailer.script(key_of(5), SendOutcome.failed(FailureClass.UNKNOWN, "timeout_after_send"))
    composer = FakeComposer()
    composer.fail_for(customer_id(7))
    policy = DeliveryPolicy()
    deliverer = make_deliverer(ledger, mailer, clock, policy=policy, composer=composer)

    [stale] = ledger.claim_due(clock.now(), "w-stale", policy.lease, limit=1)
    clock.advance(policy.lease)
    ledger.recover_expired_leases(clock.now())
    deliver_due(deliverer, batch_size=8, concurrency=4)
    make_deliverer(ledger, mailer, clock, owner="w-stale").deliver_one(stale)

    resolve_unknown(ledger, clock, key_of(6), sent=False, reason="reset", operator="ana")
    reconcile_period(ledger, mailer, clock, policy, W42)
    replay_keys(
        ledger, mailer, clock, W42, [key_of(3)], operator="ana", reason="fixed", dry_run=True
    )
    replay_keys(
        ledger, mailer, clock, W42, [key_of(3)], operator="ana", reason="fixed", dry_run=False
    )
    clock.advance(timedelta(minutes=5))
    sweep(deliverer, batch_size=8, concurrency=4)
    sweep(deliverer, batch_size=8, concurrency=4)
    clean_period(ledger, clock, W42, CleanupMode.ARCHIVE)
    period_metrics(ledger, W42, clock.now())
    assert failed_invariants(ledger, W42, clock.now()) == []
    return ledger, customers


@pytest.fixture
def records(caplog: pytest.LogCaptureFixture, clock: FixedClock) -> list[logging.LogRecord]:
    caplog.set_level(logging.DEBUG, logger="digest_pipeline")
    full_mixed_run(clock)
    return [r for r in caplog.records if r.name.startswith("digest_pipeline")]


def event_of(record: logging.LogRecord) -> str:
    found = re.match(r"event=(\S+)", record.getMessage())
    assert found is not None, record.getMessage()
    return found.group(1)


def test_no_log_record_carries_an_address_or_digest_content(records):
    secrets = [c.email for c in [make_customer(n) for n in range(1, COUNT + 1)]]
    secrets += [INVALID.email]
    secrets += [row_title(n, p) for n in range(1, COUNT + 1) for p in range(2)]

    leaks = [
        (r.getMessage(), s) for r in records for s in secrets if s.lower() in r.getMessage().lower()
    ]

    assert leaks == []


def test_every_item_level_record_names_its_operation_key(records):
    item_level = [r for r in records if event_of(r) not in PERIOD_EVENTS]

    assert [r.getMessage() for r in item_level if "key=digest:" not in r.getMessage()] == []


def test_the_mixed_run_logged_every_kind_of_item_event(records):
    # guards the two tests above against passing on an empty or partial log
    assert {event_of(r) for r in records} >= {
        "attempt_recorded",
        "mailer_raised",
        "lost_race",
        "reconciled",
        "resolved",
        "replay",
        "cleanup",
        "snapshot_frozen",
        "snapshot_reused",
        "enqueued",
        "sweep",
    }
