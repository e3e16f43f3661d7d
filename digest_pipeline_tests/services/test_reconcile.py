"""Reconciliation of `unknown` items in design §2's order: ledger, then the mailer, else wait.

An item moves only on evidence; every move is audited as `reconcile`; and a resend relies on the
provider's idempotency window so that it cannot become a second delivery.
"""

from datetime import timedelta

import pytest

from digest_pipeline.domain.errors import LostRace
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import LookupResult, Transition
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.services.reconcile import ACTOR, reconcile_period
from digest_pipeline_tests.builders import (
    complete_one,
    deliver_all,
    failed_invariants,
    frozen_ledger,
    key_of,
    make_deliverer,
    rows_of,
    start_one,
    state_of,
)
from digest_pipeline_tests.conftest import T0, W42
from digest_pipeline_tests.fakes import FakeLedger, FakeMailer, FixedClock

POLICY = DeliveryPolicy()
#: a timeout the provider never processed: the caller cannot tell it from an accepted one
TIMEOUT_NOT_ACCEPTED = SendOutcome.failed(FailureClass.UNKNOWN, "timeout_after_send")


class LedgerFirstMailer(FakeMailer):
    """A mailer that must not be asked: the ledger's own evidence comes first."""

    def lookup(self, idempotency_key: str) -> LookupResult:
        raise AssertionError("the mailer was asked although the ledger had the answer")


def unknown_item(clock: FixedClock, mailer: FakeMailer, *, accepted: bool) -> FakeLedger:
    """Customer 1's digest timed out after the request was sent; `accepted` says what the
    provider really did."""
    ledger = frozen_ledger(1)
    if accepted:
        mailer.script_timeout_after_accept(key_of(1))
    else:
        mailer.script(key_of(1), TIMEOUT_NOT_ACCEPTED)
    deliver_all(make_deliverer(ledger, mailer, clock, policy=POLICY))
    assert state_of(ledger, key_of(1)) is DeliveryState.UNKNOWN
    return ledger


def unknown_with_a_late_result(
    clock: FixedClock, outcome: SendOutcome, target: DeliveryState
) -> FakeLedger:
    """The lease expired while the attempt was open (→ unknown), then the slow worker recorded
    its outcome: the attempt is closed with it, its transition lost the race."""
    ledger = frozen_ledger(1)
    [claim] = ledger.claim_due(clock.now(), "w-slow", POLICY.lease, limit=1)
    ticket = start_one(ledger, claim, clock.now())
    clock.advance(POLICY.lease)
    assert ledger.recover_expired_leases(clock.now()).unknown == (key_of(1),)
    with pytest.raises(LostRace):
        complete_one(
            ledger,
            ticket,
            outcome,
            Transition(key_of(1), DeliveryState.CLAIMED, claim.token, target, clock.now()),
        )
    return ledger


def unknown_with_late_confirmation(clock: FixedClock) -> FakeLedger:
    """... and the outcome was the provider's confirmation."""
    return unknown_with_a_late_result(clock, SendOutcome.sent("msg-late"), DeliveryState.SENT)


def reconcile(ledger: FakeLedger, mailer: FakeMailer, clock: FixedClock):
    return reconcile_period(ledger, mailer, clock, POLICY, W42)


# --- (1) the ledger ---------------------------------------------------------------------------


def test_attempt_already_confirmed_in_the_ledger_makes_the_item_sent(clock):
    ledger = unknown_with_late_confirmation(clock)

    report = reconcile(ledger, LedgerFirstMailer(clock=clock), clock)

    item = ledger.get(key_of(1))
    assert item is not None
    assert (item.state, item.provider_message_id) == (DeliveryState.SENT, "msg-late")
    assert report.evidence == {"ledger_attempt": 1}
    assert failed_invariants(ledger, W42, clock.now()) == []


# --- (2) the mailer ---------------------------------------------------------------------------


def test_lookup_found_makes_the_item_sent_with_the_provider_id(clock):
    mailer = FakeMailer(clock=clock)
    ledger = unknown_item(clock, mailer, accepted=True)

    report = reconcile(ledger, mailer, clock)

    item = ledger.get(key_of(1))
    assert item is not None
    assert (item.state, item.provider_message_id) == (DeliveryState.SENT, "msg-1")
    assert report.evidence == {"mailer_lookup_found": 1}
    assert mailer.deliveries_for(key_of(1)) == 1
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_lookup_not_found_schedules_a_retry_due_now(clock):
    mailer = FakeMailer(clock=clock)
    ledger = unknown_item(clock, mailer, accepted=False)
    clock.advance(timedelta(minutes=3))

    report = reconcile(ledger, mailer, clock)

    item = ledger.get(key_of(1))
    assert item is not None
    assert (item.state, item.next_attempt_at) == (DeliveryState.RETRY_SCHEDULED, clock.now())
    assert report.evidence == {"mailer_lookup_not_found": 1}


def test_retry_after_lookup_not_found_delivers_exactly_once(clock):
    mailer = FakeMailer(clock=clock)
    ledger = unknown_item(clock, mailer, accepted=False)
    reconcile(ledger, mailer, clock)

    deliver_all(make_deliverer(ledger, mailer, clock, policy=POLICY))

    assert state_of(ledger, key_of(1)) is DeliveryState.SENT
    assert mailer.deliveries_for(key_of(1)) == 1
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_idempotent_mailer_without_lookup_inside_its_window_schedules_a_resend(clock):
    mailer = FakeMailer(can_lookup=False, idempotency_window=timedelta(hours=24), clock=clock)
    ledger = unknown_item(clock, mailer, accepted=True)

    report = reconcile(ledger, mailer, clock)

    item = ledger.get(key_of(1))
    assert item is not None
    assert (item.state, item.next_attempt_at) == (DeliveryState.RETRY_SCHEDULED, clock.now())
    assert report.evidence == {"idempotent_resend": 1}


def test_idempotent_resend_does_not_deliver_a_second_time(clock):
    mailer = FakeMailer(can_lookup=False, idempotency_window=timedelta(hours=24), clock=clock)
    ledger = unknown_item(clock, mailer, accepted=True)
    reconcile(ledger, mailer, clock)

    deliver_all(make_deliverer(ledger, mailer, clock, policy=POLICY))

    assert state_of(ledger, key_of(1)) is DeliveryState.SENT
    assert mailer.deliveries_for(key_of(1)) == 1
    assert (mailer.duplicate_deliveries, mailer.suppressed_duplicates) == (0, 1)
    assert [(a.outcome, a.duplicate) for a in ledger.attempts(key_of(1))] == [
        ("unknown", False),
        ("sent", True),
    ]
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_resend_claimed_after_the_idempotency_window_does_not_deliver_again(clock):
    mailer = FakeMailer(can_lookup=False, idempotency_window=timedelta(hours=24), clock=clock)
    ledger = unknown_item(clock, mailer, accepted=True)
    reconcile(ledger, mailer, clock)
    assert state_of(ledger, key_of(1)) is DeliveryState.RETRY_SCHEDULED
    clock.advance(timedelta(hours=25))  # the workers were down for a day

    deliver_all(make_deliverer(ledger, mailer, clock, policy=POLICY))

    assert mailer.deliveries_for(key_of(1)) == 1


# --- (3) no evidence: stay unknown, then dead-letter after retention --------------------------


@pytest.mark.parametrize(
    ("waited", "state"),
    [
        # the resend must reach the provider a lease before its window (24 h) ends
        (timedelta(hours=24) - POLICY.lease - timedelta(seconds=1), DeliveryState.RETRY_SCHEDULED),
        (timedelta(hours=24) - POLICY.lease, DeliveryState.UNKNOWN),
        (timedelta(hours=25), DeliveryState.UNKNOWN),
    ],
)
def test_idempotent_resend_only_well_inside_the_window(clock, waited, state):
    mailer = FakeMailer(can_lookup=False, idempotency_window=timedelta(hours=24), clock=clock)
    ledger = unknown_item(clock, mailer, accepted=True)
    clock.advance(waited)

    reconcile(ledger, mailer, clock)

    assert state_of(ledger, key_of(1)) is state


def test_non_idempotent_mailer_without_lookup_leaves_the_item_unknown(clock):
    mailer = FakeMailer(idempotent=False, can_lookup=False, clock=clock)
    ledger = unknown_item(clock, mailer, accepted=True)
    clock.advance(timedelta(hours=1))

    report = reconcile(ledger, mailer, clock)

    assert state_of(ledger, key_of(1)) is DeliveryState.UNKNOWN
    assert (report.examined, report.still_unknown, report.moved) == (1, 1, {})
    assert ledger.audit_log(W42) == []
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_unknown_item_keeps_its_generated_rows_while_it_waits(clock):
    mailer = FakeMailer(idempotent=False, can_lookup=False, clock=clock)
    ledger = unknown_item(clock, mailer, accepted=True)

    reconcile(ledger, mailer, clock)

    assert len(rows_of(ledger, key_of(1))) == 2


@pytest.mark.parametrize(
    ("waited", "state"),
    [
        (POLICY.unknown_retention - timedelta(seconds=1), DeliveryState.UNKNOWN),
        (POLICY.unknown_retention, DeliveryState.DEAD_LETTERED),
    ],
)
def test_unresolved_unknown_is_dead_lettered_after_retention(clock, waited, state):
    mailer = FakeMailer(idempotent=False, can_lookup=False, clock=clock)
    ledger = unknown_item(clock, mailer, accepted=True)
    clock.advance(waited)

    reconcile(ledger, mailer, clock)

    assert state_of(ledger, key_of(1)) is state


def test_dead_lettered_unknown_has_reason_unknown_unresolved_and_keeps_its_rows(clock):
    mailer = FakeMailer(idempotent=False, can_lookup=False, clock=clock)
    ledger = unknown_item(clock, mailer, accepted=True)
    clock.advance(POLICY.unknown_retention)

    reconcile(ledger, mailer, clock)

    assert [d.reason for d in ledger.dead_letters(W42)] == ["unknown_unresolved"]
    assert len(rows_of(ledger, key_of(1))) == 2
    assert failed_invariants(ledger, W42, clock.now()) == []


# --- audit and scope --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mailer_kwargs", "accepted", "waited", "target", "evidence"),
    [
        ({}, True, timedelta(0), DeliveryState.SENT, "mailer_lookup_found"),
        ({}, False, timedelta(0), DeliveryState.RETRY_SCHEDULED, "mailer_lookup_not_found"),
        (
            {"can_lookup": False},
            True,
            timedelta(0),
            DeliveryState.RETRY_SCHEDULED,
            "idempotent_resend",
        ),
        (
            {"can_lookup": False, "idempotent": False},
            True,
            POLICY.unknown_retention,
            DeliveryState.DEAD_LETTERED,
            "unknown_unresolved",
        ),
    ],
)
def test_every_reconcile_move_writes_an_audit_row(
    clock, mailer_kwargs, accepted, waited, target, evidence
):
    mailer = FakeMailer(clock=clock, **mailer_kwargs)
    ledger = unknown_item(clock, mailer, accepted=accepted)
    clock.advance(waited)

    reconcile(ledger, mailer, clock)

    [entry] = ledger.audit_log(W42)
    assert (entry.actor, entry.action, entry.key, entry.from_state, entry.to_state) == (
        ACTOR,
        "reconcile",
        key_of(1),
        DeliveryState.UNKNOWN,
        target,
    )
    assert (entry.reason, entry.at) == (f"evidence:{evidence}", clock.now())


def test_ledger_confirmation_move_is_audited_too(clock):
    ledger = unknown_with_late_confirmation(clock)

    reconcile(ledger, FakeMailer(clock=clock), clock)

    assert [(e.action, e.reason) for e in ledger.audit_log(W42)] == [
        ("reconcile", "evidence:ledger_attempt")
    ]


def test_reconcile_leaves_items_that_are_not_unknown_alone(clock):
    ledger, mailer = frozen_ledger(3), FakeMailer(clock=clock)
    mailer.script(key_of(2), SendOutcome.failed(FailureClass.TRANSIENT, "smtp:421"))
    mailer.script(key_of(3), SendOutcome.failed(FailureClass.PERMANENT, "smtp:550"))
    deliver_all(make_deliverer(ledger, mailer, clock, policy=POLICY))
    before = ledger.items(W42)

    report = reconcile(ledger, mailer, clock)

    assert report.examined == 0
    assert ledger.items(W42) == before


def test_second_reconcile_changes_nothing(clock):
    mailer = FakeMailer(clock=clock)
    ledger = unknown_item(clock, mailer, accepted=True)
    reconcile(ledger, mailer, clock)
    before = (ledger.items(W42), ledger.audit_log(W42))

    report = reconcile(ledger, mailer, clock)

    assert report.examined == 0
    assert (ledger.items(W42), ledger.audit_log(W42)) == before


def test_reconcile_time_comes_from_the_clock():
    clock = FixedClock(T0)
    mailer = FakeMailer(clock=clock)
    ledger = unknown_item(clock, mailer, accepted=True)
    clock.advance(timedelta(minutes=7))

    reconcile(ledger, mailer, clock)

    item = ledger.get(key_of(1))
    assert item is not None
    assert item.sent_at == T0 + timedelta(minutes=7)


def test_unknown_after_the_window_closed_is_not_turned_into_a_resend_that_cannot_happen():
    closes_at = POLICY.closes_at(W42)
    clock = FixedClock(closes_at - timedelta(minutes=30))
    mailer = FakeMailer(can_lookup=False, idempotency_window=timedelta(hours=24), clock=clock)
    ledger = unknown_item(clock, mailer, accepted=True)
    clock.set(closes_at + timedelta(minutes=30))  # still inside the provider's window

    reconcile(ledger, mailer, clock)
    deliver_all(make_deliverer(ledger, mailer, clock, policy=POLICY))

    assert state_of(ledger, key_of(1)) in {DeliveryState.UNKNOWN, DeliveryState.SENT}
    assert [d.reason for d in ledger.dead_letters(W42)] == []


# --- a history that proves nothing left -----------------------------------------------------


def unknown_after_a_slow_transient_failure(clock: FixedClock) -> FakeLedger:
    """... and the outcome was transient: the ledger itself proves nothing left."""
    refused = SendOutcome.failed(FailureClass.TRANSIENT, "connection_refused")
    return unknown_with_a_late_result(clock, refused, DeliveryState.RETRY_SCHEDULED)


def test_unknown_whose_attempts_all_closed_as_not_accepted_is_due_again(clock):
    # a provider that neither deduplicates nor answers lookups: only the ledger can settle it
    mailer = FakeMailer(idempotent=False, can_lookup=False, clock=clock)
    ledger = unknown_after_a_slow_transient_failure(clock)

    report = reconcile(ledger, mailer, clock)

    item = ledger.get(key_of(1))
    assert item is not None
    assert (item.state, item.next_attempt_at) == (DeliveryState.RETRY_SCHEDULED, clock.now())
    assert report.evidence == {"ledger_attempts_not_accepted": 1}
    deliver_all(make_deliverer(ledger, mailer, clock, policy=POLICY))
    assert state_of(ledger, key_of(1)) is DeliveryState.SENT
    assert mailer.deliveries_for(key_of(1)) == 1
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_an_unknown_attempt_in_the_history_is_not_proof_of_not_sent(clock):
    mailer = FakeMailer(idempotent=False, can_lookup=False, clock=clock)
    ledger = unknown_item(clock, mailer, accepted=True)

    report = reconcile(ledger, mailer, clock)

    assert state_of(ledger, key_of(1)) is DeliveryState.UNKNOWN
    assert report.evidence == {}
