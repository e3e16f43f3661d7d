"""Operator resolution of an `unknown` item: audited, and refused without changing anything."""

from datetime import timedelta

import pytest

from digest_pipeline.domain.errors import DigestError, ResolveRefused, UnknownWorkItem
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.services.resolve import resolve_unknown
from digest_pipeline_tests.builders import (
    deliver_all,
    failed_invariants,
    frozen_ledger,
    key_of,
    make_deliverer,
    state_of,
)
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.fakes import FakeLedger, FakeMailer, FixedClock


def period_with_unknown(clock: FixedClock, mailer: FakeMailer) -> FakeLedger:
    """Customer 1 `unknown` (the provider never got the request), customer 2 `sent`."""
    ledger = frozen_ledger(2)
    mailer.script(key_of(1), SendOutcome.failed(FailureClass.UNKNOWN, "timeout_after_send"))
    deliver_all(make_deliverer(ledger, mailer, clock))
    assert state_of(ledger, key_of(1)) is DeliveryState.UNKNOWN
    return ledger


def test_resolving_as_sent_makes_the_item_sent(clock):
    ledger = period_with_unknown(clock, FakeMailer(clock=clock))
    clock.advance(timedelta(hours=2))

    item = resolve_unknown(
        ledger, clock, key_of(1), sent=True, reason="seen in provider dashboard", operator="ana"
    )

    assert (item.state, item.sent_at, item.next_attempt_at) == (
        DeliveryState.SENT,
        clock.now(),
        None,
    )
    assert ledger.get(key_of(1)) == item
    assert failed_invariants(ledger, W42, clock.now()) == []


@pytest.mark.parametrize(
    ("sent", "target"), [(True, DeliveryState.SENT), (False, DeliveryState.RETRY_SCHEDULED)]
)
def test_resolution_is_audited_with_operator_and_reason(clock, sent, target):
    ledger = period_with_unknown(clock, FakeMailer(clock=clock))

    resolve_unknown(ledger, clock, key_of(1), sent=sent, reason="  ticket OPS-12  ", operator="ana")

    [entry] = ledger.audit_log(W42)
    assert (entry.actor, entry.action, entry.reason) == ("ana", "resolve", "ticket OPS-12")
    assert (entry.key, entry.from_state, entry.to_state, entry.at) == (
        key_of(1),
        DeliveryState.UNKNOWN,
        target,
        clock.now(),
    )


def test_resolving_as_not_sent_schedules_a_retry_due_now(clock):
    ledger = period_with_unknown(clock, FakeMailer(clock=clock))
    clock.advance(timedelta(minutes=10))

    item = resolve_unknown(
        ledger, clock, key_of(1), sent=False, reason="bounced upstream", operator="ana"
    )

    assert (item.state, item.next_attempt_at) == (DeliveryState.RETRY_SCHEDULED, clock.now())


def test_next_delivery_after_not_sent_uses_the_same_operation_key(clock):
    mailer = FakeMailer(clock=clock)
    ledger = period_with_unknown(clock, mailer)
    resolve_unknown(ledger, clock, key_of(1), sent=False, reason="not received", operator="ana")

    deliver_all(make_deliverer(ledger, mailer, clock))

    [(idempotency_key, _, message)] = [d for d in mailer.deliveries if d[2].key == key_of(1)]
    assert idempotency_key == str(key_of(1))
    assert dict(message.headers)["X-Digest-Operation-Key"] == str(key_of(1))
    assert {a.key for a in ledger.attempts(key_of(1))} == {key_of(1)}
    assert state_of(ledger, key_of(1)) is DeliveryState.SENT
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_not_sent_resolution_of_a_message_the_provider_had_is_deduplicated(clock):
    mailer = FakeMailer(clock=clock)
    ledger = frozen_ledger(1)
    mailer.script_timeout_after_accept(key_of(1))
    deliverer = make_deliverer(ledger, mailer, clock)
    deliver_all(deliverer)
    resolve_unknown(ledger, clock, key_of(1), sent=False, reason="operator guess", operator="ana")

    deliver_all(deliverer)

    assert mailer.deliveries_for(key_of(1)) == 1


@pytest.mark.parametrize(
    ("number", "reason", "operator", "error"),
    [
        (2, "looks sent", "ana", ResolveRefused),  # a sent item is not unknown
        (1, "", "ana", ResolveRefused),  # a resolution needs a reason
        (1, "   ", "ana", ResolveRefused),  # whitespace is no reason
        (1, "looks sent", " ", ResolveRefused),  # a resolution needs an operator
        (9999, "looks sent", "ana", UnknownWorkItem),  # no such key
    ],
)
@pytest.mark.parametrize("sent", [True, False])
def test_refused_resolution_raises_and_changes_nothing(
    clock, number, reason, operator, error, sent
):
    ledger = period_with_unknown(clock, FakeMailer(clock=clock))
    before = (ledger.items(W42), ledger.audit_log(), ledger.dead_letters(W42))

    with pytest.raises(error):
        resolve_unknown(ledger, clock, key_of(number), sent=sent, reason=reason, operator=operator)

    assert (ledger.items(W42), ledger.audit_log(), ledger.dead_letters(W42)) == before


@pytest.mark.parametrize("error", [ResolveRefused, UnknownWorkItem])
def test_resolve_refusals_are_digest_errors(error):
    assert issubclass(error, DigestError)


def test_an_item_can_be_resolved_only_once(clock):
    ledger = period_with_unknown(clock, FakeMailer(clock=clock))
    resolve_unknown(ledger, clock, key_of(1), sent=True, reason="seen", operator="ana")
    before = (ledger.items(W42), ledger.audit_log())

    with pytest.raises(ResolveRefused):
        resolve_unknown(ledger, clock, key_of(1), sent=False, reason="changed mind", operator="bo")

    assert (ledger.items(W42), ledger.audit_log()) == before
