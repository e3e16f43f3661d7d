"""Replay refusals, checked as a whole with nothing changed, and possible duplicates refused unless accepted."""

from datetime import timedelta

import pytest

from digest_pipeline.domain.errors import PossibleDuplicateRefused, ReplayRefused
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import Transition
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.services.reconcile import reconcile_period
from digest_pipeline.services.replay import (
    DEFAULT_REPLAY_CAP,
    ReplayPlan,
)
from digest_pipeline_tests.builders import (
    deliver_all,
    frozen_ledger,
    key_of,
    make_deliverer,
    state_of,
)
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.fakes import FakeLedger, FakeMailer, FixedClock
from digest_pipeline_tests.outcomes import PERMANENT, TRANSIENT
from digest_pipeline_tests.services.replay_steps import (
    POLICY,
    W43,
    everything,
    period_to_replay,
    replay,
)

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
