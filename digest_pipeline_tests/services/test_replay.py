"""Bounded, audited replay: checked as a whole, reconciled first, never a blind second send."""

from datetime import timedelta

import pytest

from digest_pipeline.domain.errors import LostRace
from digest_pipeline.domain.failures import SendOutcome
from digest_pipeline.domain.model import Transition
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.retry import RetryPolicy
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.services.replay import (
    ReplayPlan,
)
from digest_pipeline.services.resolve import resolve_unknown
from digest_pipeline_tests.builders import (
    complete_one,
    deliver_all,
    failed_invariants,
    frozen_ledger,
    key_of,
    make_deliverer,
    start_one,
    state_of,
)
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.fakes import FakeLedger, FakeMailer, FixedClock
from digest_pipeline_tests.outcomes import TRANSIENT
from digest_pipeline_tests.services.replay_steps import (
    POLICY,
    STATES,
    W43,
    everything,
    period_to_replay,
    replay,
)

# --- what a replay does ----------------------------------------------------------------------


@pytest.mark.parametrize("number", [1, 2])  # failed, dead_lettered
def test_replay_reopens_a_replayable_key_as_pending(clock, number):
    mailer = FakeMailer(clock=clock)
    ledger = period_to_replay(clock, mailer)

    report = replay(ledger, mailer, clock, [key_of(number)])

    assert [(line.key, line.state, line.plan) for line in report.lines] == [
        (key_of(number), STATES[number], ReplayPlan.REPLAY)
    ]
    assert state_of(ledger, key_of(number)) is DeliveryState.PENDING


def test_replay_touches_only_the_keys_it_was_given(clock):
    mailer = FakeMailer(clock=clock)
    ledger = period_to_replay(clock, mailer)

    replay(ledger, mailer, clock, [key_of(2)])

    assert {n: state_of(ledger, key_of(n)) for n in STATES} == STATES | {2: DeliveryState.PENDING}
    assert state_of(ledger, key_of(1, W43)) is DeliveryState.FAILED


def test_replayed_item_gets_a_fresh_budget_and_is_due_now(clock):
    mailer = FakeMailer(clock=clock)
    ledger = period_to_replay(clock, mailer)
    clock.advance(timedelta(hours=3))

    replay(ledger, mailer, clock, [key_of(2)])

    item = ledger.get(key_of(2))
    assert item is not None
    assert (item.budget_used, item.window_started_at, item.attempts) == (0, None, 1)
    assert (item.replayed_at, item.next_attempt_at) == (clock.now(), clock.now())


def test_replay_marks_the_dead_letter_row_replayed(clock):
    mailer = FakeMailer(clock=clock)
    ledger = period_to_replay(clock, mailer)
    clock.advance(timedelta(hours=3))

    replay(ledger, mailer, clock, [key_of(2)])

    assert {str(d.key): d.replayed_at for d in ledger.dead_letters(W42)} == {
        str(key_of(1)): None,
        str(key_of(2)): clock.now(),
        str(key_of(5)): None,
    }


def test_replay_is_audited_with_operator_and_reason(clock):
    mailer = FakeMailer(clock=clock)
    ledger = period_to_replay(clock, mailer)

    replay(ledger, mailer, clock, [key_of(1), key_of(2)], operator="ana", reason="OPS-7")

    entries = ledger.audit_log(W42)
    assert [(e.key, e.actor, e.action, e.from_state, e.to_state) for e in entries] == [
        (key_of(1), "ana", "replay", DeliveryState.FAILED, DeliveryState.PENDING),
        (key_of(2), "ana", "replay", DeliveryState.DEAD_LETTERED, DeliveryState.PENDING),
    ]
    assert all(e.reason.startswith("OPS-7") for e in entries)


def test_replayed_item_is_delivered_by_the_next_run_after_the_window_closed(clock):
    mailer = FakeMailer(clock=clock)
    ledger = period_to_replay(clock, mailer)
    clock.set(POLICY.closes_at(W42) + timedelta(days=1))
    replay(ledger, mailer, clock, [key_of(2)])

    report = deliver_all(make_deliverer(ledger, mailer, clock, policy=POLICY))

    assert report.outcomes == {"sent": 1}
    assert state_of(ledger, key_of(2)) is DeliveryState.SENT
    assert mailer.deliveries_for(key_of(2)) == 1
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_replayed_item_is_retried_on_a_fresh_budget(clock):
    mailer = FakeMailer(clock=clock)
    ledger = period_to_replay(clock, mailer)
    policy = DeliveryPolicy(retry=RetryPolicy(max_attempts=2))
    replay(ledger, mailer, clock, [key_of(2)])
    mailer.script(key_of(2), TRANSIENT)

    deliver_all(make_deliverer(ledger, mailer, clock, policy=policy))

    item = ledger.get(key_of(2))
    assert item is not None
    assert (item.state, item.budget_used, item.attempts) == (DeliveryState.RETRY_SCHEDULED, 1, 2)


def test_replay_leaves_other_items_undelivered(clock):
    mailer = FakeMailer(clock=clock)
    ledger = period_to_replay(clock, mailer)
    sends_before = mailer.sends
    replay(ledger, mailer, clock, [key_of(1)])

    deliver_all(make_deliverer(ledger, mailer, clock, policy=POLICY))

    assert mailer.sends == sends_before + 1
    assert mailer.sends_for(key_of(5)) == 1


@pytest.mark.parametrize(
    ("can_lookup", "evidence"),
    [(True, "mailer_lookup_not_found"), (False, "mailer_lookup_unsupported")],
)
def test_replay_line_names_what_reconciliation_found(clock, can_lookup, evidence):
    mailer = FakeMailer(can_lookup=can_lookup, clock=clock)
    ledger = period_to_replay(clock, mailer)

    report = replay(ledger, mailer, clock, [key_of(2)])

    assert [line.evidence for line in report.lines] == [evidence]


# --- dry run ----------------------------------------------------------------------------------


def test_dry_run_reports_the_plans_and_changes_nothing(clock):
    mailer = FakeMailer(clock=clock)
    ledger = period_to_replay(clock, mailer)
    before = everything(ledger)

    report = replay(ledger, mailer, clock, [key_of(1), key_of(2)], dry_run=True)

    assert report.dry_run
    assert [(line.key, line.plan) for line in report.lines] == [
        (key_of(1), ReplayPlan.REPLAY),
        (key_of(2), ReplayPlan.REPLAY),
    ]
    assert report.replayed == 2
    assert everything(ledger) == before


# --- evidence of delivery: reported, never reopened -------------------------------------------


def dead_lettered_with_ledger_evidence(clock: FixedClock) -> FakeLedger:
    """The slow worker's attempt was confirmed after its lease was recovered and an operator
    had resolved it as not sent; the window then closed before the retry."""
    ledger, policy = frozen_ledger(1), DeliveryPolicy()
    [claim] = ledger.claim_due(clock.now(), "w-slow", policy.lease, limit=1)
    ticket = start_one(ledger, claim, clock.now())
    clock.advance(policy.lease)
    ledger.recover_expired_leases(clock.now())
    resolve_unknown(ledger, clock, key_of(1), sent=False, reason="looked lost", operator="ana")
    with pytest.raises(LostRace):
        complete_one(
            ledger,
            ticket,
            SendOutcome.sent("msg-late"),
            Transition(
                key_of(1), DeliveryState.CLAIMED, claim.token, DeliveryState.SENT, clock.now()
            ),
        )
    clock.set(policy.closes_at(W42))
    deliver_all(make_deliverer(ledger, FakeMailer(can_lookup=False), clock, policy=policy))
    assert state_of(ledger, key_of(1)) is DeliveryState.DEAD_LETTERED
    return ledger


def dead_lettered_with_provider_evidence(clock: FixedClock, mailer: FakeMailer) -> FakeLedger:
    """The provider accepted, the caller timed out, an operator wrongly resolved it as not
    sent, and the window closed before the retry."""
    ledger, policy = frozen_ledger(1), DeliveryPolicy()
    mailer.script_timeout_after_accept(key_of(1))
    deliver_all(make_deliverer(ledger, mailer, clock, policy=policy))
    resolve_unknown(ledger, clock, key_of(1), sent=False, reason="looked lost", operator="ana")
    clock.set(policy.closes_at(W42))
    deliver_all(make_deliverer(ledger, mailer, clock, policy=policy))
    assert state_of(ledger, key_of(1)) is DeliveryState.DEAD_LETTERED
    return ledger


def test_key_with_a_confirmed_ledger_attempt_is_reported_already_delivered(clock):
    ledger = dead_lettered_with_ledger_evidence(clock)

    report = replay(ledger, FakeMailer(can_lookup=False, clock=clock), clock, [key_of(1)])

    assert [(line.plan, line.evidence) for line in report.lines] == [
        (ReplayPlan.ALREADY_DELIVERED, "ledger_attempt")
    ]
    assert state_of(ledger, key_of(1)) is DeliveryState.DEAD_LETTERED
    assert report.replayed == 0


def test_key_the_provider_found_is_reported_already_delivered_and_not_sent_again(clock):
    mailer = FakeMailer(clock=clock)
    ledger = dead_lettered_with_provider_evidence(clock, mailer)

    report = replay(ledger, mailer, clock, [key_of(1)])
    deliver_all(make_deliverer(ledger, mailer, clock))

    assert [(line.plan, line.evidence) for line in report.lines] == [
        (ReplayPlan.ALREADY_DELIVERED, "mailer_lookup_found")
    ]
    assert state_of(ledger, key_of(1)) is DeliveryState.DEAD_LETTERED
    assert mailer.sends_for(key_of(1)) == 1


def test_skipped_key_is_audited_as_replay_skipped(clock):
    mailer = FakeMailer(clock=clock)
    ledger = dead_lettered_with_provider_evidence(clock, mailer)

    replay(ledger, mailer, clock, [key_of(1)], operator="bo", reason="customer asked")

    last = ledger.audit_log(W42)[-1]
    assert (last.actor, last.action, last.from_state, last.to_state) == (
        "bo",
        "replay_skipped",
        DeliveryState.DEAD_LETTERED,
        DeliveryState.DEAD_LETTERED,
    )
    assert last.reason == "customer asked (evidence:mailer_lookup_found)"
