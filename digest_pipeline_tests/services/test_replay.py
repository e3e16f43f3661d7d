"""Bounded, audited replay: checked as a whole, reconciled first, never a blind second send."""

from datetime import timedelta

import pytest

from digest_pipeline.domain.errors import LostRace, PossibleDuplicateRefused, ReplayRefused
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import Transition
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.retry import RetryPolicy
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.services.reconcile import reconcile_period
from digest_pipeline.services.replay import (
    DEFAULT_REPLAY_CAP,
    ReplayPlan,
    ReplayReport,
    replay_keys,
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

W43 = Period(2026, 43)
#: one attempt per item, so a transient failure dead-letters at once
POLICY = DeliveryPolicy(retry=RetryPolicy(max_attempts=1))
TRANSIENT = SendOutcome.failed(FailureClass.TRANSIENT, "smtp:421")
PERMANENT = SendOutcome.failed(FailureClass.PERMANENT, "smtp:550")

#: customer number -> the state `period_to_replay` leaves it in
STATES = {
    1: DeliveryState.FAILED,
    2: DeliveryState.DEAD_LETTERED,
    3: DeliveryState.SENT,
    4: DeliveryState.UNKNOWN,
    5: DeliveryState.DEAD_LETTERED,
}


def period_to_replay(clock: FixedClock, mailer: FakeMailer) -> FakeLedger:
    """W42 in the states of STATES, and W43 with customer 1 failed."""
    ledger = frozen_ledger(5)
    frozen_ledger(1, period=W43, ledger=ledger)
    mailer.script(key_of(1), PERMANENT)
    mailer.script(key_of(2), TRANSIENT)
    mailer.script(key_of(4), SendOutcome.failed(FailureClass.UNKNOWN, "timeout_after_send"))
    mailer.script(key_of(5), TRANSIENT)
    mailer.script(key_of(1, W43), PERMANENT)
    deliver_all(make_deliverer(ledger, mailer, clock, policy=POLICY))
    assert {n: state_of(ledger, key_of(n)) for n in STATES} == STATES
    return ledger


def replay(
    ledger: FakeLedger,
    mailer: FakeMailer,
    clock: FixedClock,
    keys: list[OperationKey],
    *,
    dry_run: bool = False,
    operator: str = "ana",
    reason: str = "provider outage OPS-7",
    cap: int = DEFAULT_REPLAY_CAP,
    accept: bool = False,
) -> ReplayReport:
    return replay_keys(
        ledger,
        mailer,
        clock,
        W42,
        keys,
        operator=operator,
        reason=reason,
        dry_run=dry_run,
        cap=cap,
        accept_possible_duplicate=accept,
    )


def everything(ledger: FakeLedger) -> tuple[object, ...]:
    """Every record a refused or dry-run replay must leave as it was."""
    return (
        ledger.items(W42),
        ledger.items(W43),
        ledger.audit_log(),
        ledger.dead_letters(W42),
        ledger.dead_letters(W43),
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


# --- refusals: checked as a whole, nothing changed --------------------------------------------


def dead_lettered_period(clock: FixedClock, mailer: FakeMailer, count: int) -> FakeLedger:
    ledger = frozen_ledger(count)
    for n in range(1, count + 1):
        mailer.script(key_of(n), TRANSIENT)
    deliver_all(make_deliverer(ledger, mailer, clock, policy=POLICY), batch_size=200)
    return ledger


def test_more_keys_than_the_cap_are_refused_and_nothing_changes(clock):
    mailer = FakeMailer(clock=clock)
    ledger = dead_lettered_period(clock, mailer, DEFAULT_REPLAY_CAP + 1)
    before = (ledger.items(W42), ledger.audit_log(), ledger.dead_letters(W42))

    with pytest.raises(ReplayRefused, match="101 keys exceed the replay cap of 100"):
        replay(ledger, mailer, clock, [key_of(n) for n in range(1, 102)])

    assert (ledger.items(W42), ledger.audit_log(), ledger.dead_letters(W42)) == before


def test_exactly_the_cap_is_replayed(clock):
    mailer = FakeMailer(clock=clock)
    ledger = dead_lettered_period(clock, mailer, DEFAULT_REPLAY_CAP + 1)

    report = replay(ledger, mailer, clock, [key_of(n) for n in range(1, 101)])

    assert report.replayed == 100
    assert ledger.state_counts(W42) == {DeliveryState.PENDING: 100, DeliveryState.DEAD_LETTERED: 1}


def test_a_repeated_key_counts_once_against_the_cap(clock):
    mailer = FakeMailer(clock=clock)
    ledger = dead_lettered_period(clock, mailer, 3)

    report = replay(ledger, mailer, clock, [key_of(1), key_of(1), key_of(2)], cap=2)

    assert [line.key for line in report.lines] == [key_of(1), key_of(2)]


def test_a_raised_cap_allows_more_keys_and_the_audit_says_so(clock):
    mailer = FakeMailer(clock=clock)
    ledger = dead_lettered_period(clock, mailer, DEFAULT_REPLAY_CAP + 1)

    report = replay(ledger, mailer, clock, [key_of(n) for n in range(1, 102)], cap=101)

    assert report.replayed == 101
    assert all("cap raised to 101" in e.reason for e in ledger.audit_log(W42))


class RacingLedger(FakeLedger):
    """Another operator replays key 2 between this replay's check and its move."""

    def apply(self, transition: Transition) -> None:
        if transition.key == key_of(2) and transition.target is DeliveryState.PENDING:
            super().apply(transition)  # the other operator wins
        super().apply(transition)


def test_a_key_moved_meanwhile_is_reported_and_the_other_keys_still_replay(clock):
    mailer = FakeMailer(clock=clock)
    ledger = period_to_replay(clock, mailer)
    racing = RacingLedger()
    racing.__dict__.update(ledger.__dict__)

    report = replay(racing, mailer, clock, [key_of(1), key_of(2), key_of(5)])

    plans = {line.key: line.plan for line in report.lines}
    assert plans == {
        key_of(1): ReplayPlan.REPLAY,
        key_of(2): ReplayPlan.CHANGED_MEANWHILE,
        key_of(5): ReplayPlan.REPLAY,
    }
    assert {state_of(racing, key_of(n)) for n in (1, 2, 5)} == {DeliveryState.PENDING}


@pytest.mark.parametrize(
    ("bad_key", "named_as"),
    [
        (key_of(1, W43), "is not of period 2026-W42"),  # another period's key
        (key_of(9999), "is unknown"),  # no such item
        (key_of(3), "is sent, not dead_lettered or failed"),  # delivered
        (key_of(4), "is unknown, not dead_lettered or failed"),  # awaiting reconciliation
    ],
)
def test_a_key_that_cannot_be_replayed_refuses_the_whole_request_naming_it(
    clock, bad_key, named_as
):
    mailer = FakeMailer(clock=clock)
    ledger = period_to_replay(clock, mailer)
    before = everything(ledger)

    with pytest.raises(ReplayRefused) as refused:
        replay(ledger, mailer, clock, [key_of(1), bad_key, key_of(2)])

    assert f"{bad_key} {named_as}" in str(refused.value)
    assert everything(ledger) == before


def test_refusal_names_every_offending_key(clock):
    mailer = FakeMailer(clock=clock)
    ledger = period_to_replay(clock, mailer)

    with pytest.raises(ReplayRefused) as refused:
        replay(ledger, mailer, clock, [key_of(3), key_of(9999), key_of(1, W43)])

    assert all(str(k) in str(refused.value) for k in (key_of(3), key_of(9999), key_of(1, W43)))


@pytest.mark.parametrize(
    ("keys", "operator", "reason"),
    [
        ([], "ana", "OPS-7"),  # no keys
        ([key_of(1)], "", "OPS-7"),  # no operator
        ([key_of(1)], "ana", "  "),  # no reason
    ],
)
def test_incomplete_request_is_refused_and_nothing_changes(clock, keys, operator, reason):
    mailer = FakeMailer(clock=clock)
    ledger = period_to_replay(clock, mailer)
    before = everything(ledger)

    with pytest.raises(ReplayRefused):
        replay(ledger, mailer, clock, keys, operator=operator, reason=reason)

    assert everything(ledger) == before


def test_refused_dry_run_is_refused_too(clock):
    mailer = FakeMailer(clock=clock)
    ledger = period_to_replay(clock, mailer)

    with pytest.raises(ReplayRefused):
        replay(ledger, mailer, clock, [key_of(3)], dry_run=True)


# --- possible duplicates: refused as a whole unless accepted ----------------------------------


def failed_and_possibly_delivered(clock: FixedClock, mailer: FakeMailer) -> FakeLedger:
    """Key 1 failed (550, nothing left); key 2's first send was accepted but timed out, and the
    idempotent resend got a 409, so it is dead-lettered `unknown_unresolved`. A day passes."""
    ledger = frozen_ledger(2)
    mailer.script(key_of(1), PERMANENT)
    conflict = SendOutcome.failed(FailureClass.PERMANENT, "http:409:invalid_idempotent_request")
    mailer.script(key_of(2), FakeMailer.ACCEPTED_THEN_TIMEOUT, conflict)
    deliver_all(make_deliverer(ledger, mailer, clock))
    reconcile_period(ledger, mailer, clock, DeliveryPolicy(), W42)
    deliver_all(make_deliverer(ledger, mailer, clock))
    assert (state_of(ledger, key_of(1)), state_of(ledger, key_of(2))) == (
        DeliveryState.FAILED,
        DeliveryState.DEAD_LETTERED,
    )
    clock.advance(timedelta(days=1))
    return ledger


def test_one_possible_duplicate_refuses_the_whole_request_naming_only_it(clock):
    mailer = FakeMailer(can_lookup=False, clock=clock)
    ledger = failed_and_possibly_delivered(clock, mailer)
    before = everything(ledger)

    with pytest.raises(PossibleDuplicateRefused) as refused:
        replay(ledger, mailer, clock, [key_of(1), key_of(2)])

    assert refused.value.keys == (str(key_of(2)),)
    assert str(key_of(1)) not in str(refused.value)
    assert everything(ledger) == before


def test_accepting_possible_duplicates_replays_every_key_and_audits_each_kind(clock):
    mailer = FakeMailer(can_lookup=False, clock=clock)
    ledger = failed_and_possibly_delivered(clock, mailer)

    report = replay(ledger, mailer, clock, [key_of(1), key_of(2)], accept=True)

    assert [line.plan for line in report.lines] == [
        ReplayPlan.REPLAY,
        ReplayPlan.POSSIBLE_DUPLICATE,
    ]
    assert report.replayed == 2
    assert [(e.key, e.action) for e in ledger.audit_log(W42) if e.actor == "ana"] == [
        (key_of(1), "replay"),
        (key_of(2), "replay_possible_duplicate"),
    ]


def test_a_dry_run_without_acceptance_reports_the_possible_duplicate_and_refuses_nothing(clock):
    mailer = FakeMailer(can_lookup=False, clock=clock)
    ledger = failed_and_possibly_delivered(clock, mailer)
    before = everything(ledger)

    report = replay(ledger, mailer, clock, [key_of(1), key_of(2)], dry_run=True)

    assert [line.plan for line in report.lines] == [
        ReplayPlan.REPLAY,
        ReplayPlan.POSSIBLE_DUPLICATE,
    ]
    assert (report.replayed, report.possible_duplicates) == (1, (key_of(2),))
    assert everything(ledger) == before
