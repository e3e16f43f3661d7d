"""Missed and late weeks over the fakes: the refusal, the audited grant, the late window, the sweep."""

from datetime import timedelta

import pytest

from digest_pipeline.domain.errors import LateWeekRefused
from digest_pipeline.domain.model import CleanupMode
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.services import period_gate
from digest_pipeline.services.pipeline import sweep
from digest_pipeline_tests.builders import (
    deliver_all,
    failed_invariants,
    frozen_ledger,
    make_deliverer,
    seed_period,
)
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.fakes import FakeMailer, FixedClock

# every test here on both delivery loops: a provider's pool and a local mailer's ledger thread
pytestmark = pytest.mark.usefixtures("both_mailer_kinds")

POLICY = DeliveryPolicy()
CLOSED = POLICY.closes_at(W42) + timedelta(hours=1)


def test_a_week_attempted_in_time_is_never_refused_later(clock):
    ledger, mailer = frozen_ledger(2), FakeMailer(clock=clock)
    deliver_all(make_deliverer(ledger, mailer, clock))
    assert period_gate.refusal(ledger, POLICY, W42, CLOSED + timedelta(days=60)) is None


def test_a_missed_week_is_refused_and_the_refusal_records_nothing():
    ledger = frozen_ledger(2)
    before = (ledger.items(W42), ledger.audit_log())

    with pytest.raises(LateWeekRefused, match="before any digest was attempted"):
        period_gate.require_deliverable(ledger, POLICY, W42, CLOSED)

    assert (ledger.items(W42), ledger.audit_log()) == before


def test_a_grant_is_audited_and_delivers_the_week_inside_its_late_window():
    clock = FixedClock(CLOSED)
    ledger, mailer = frozen_ledger(3), FakeMailer(clock=clock)

    closes = period_gate.grant_late_delivery(
        ledger, POLICY, W42, clock.now(), "ops", "scheduler down"
    )
    deliver_all(make_deliverer(ledger, mailer, clock))

    assert closes == CLOSED + POLICY.late_window
    [entry] = ledger.audit_log(W42)
    assert (entry.actor, entry.action, entry.reason) == (
        "ops",
        period_gate.LATE_ACTION,
        "scheduler down",
    )
    assert ledger.state_counts(W42) == {DeliveryState.SENT: 3}
    assert period_gate.refusal(ledger, POLICY, W42, clock.now()) is None
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_items_left_after_the_late_window_are_dead_lettered_window_closed():
    clock = FixedClock(CLOSED)
    ledger, mailer = frozen_ledger(2), FakeMailer(clock=clock)
    period_gate.grant_late_delivery(ledger, POLICY, W42, clock.now(), "ops", "scheduler down")
    clock.advance(POLICY.late_window)

    deliver_all(make_deliverer(ledger, mailer, clock))

    assert mailer.sends == 0
    assert {d.reason for d in ledger.dead_letters(W42)} == {"window_closed"}


@pytest.mark.parametrize(
    ("operator", "reason", "now", "says"),
    [
        ("ops", "", CLOSED, "needs an operator and a reason"),
        ("", "why", CLOSED, "needs an operator and a reason"),
        ("ops", "why", CLOSED - timedelta(hours=2), "is not needed"),
    ],
)
def test_a_grant_is_refused_without_who_and_why_or_while_the_window_is_open(
    operator, reason, now, says
):
    ledger = frozen_ledger(1)
    with pytest.raises(LateWeekRefused, match=says):
        period_gate.grant_late_delivery(ledger, POLICY, W42, now, operator, reason)
    assert ledger.audit_log() == []


def test_the_sweep_leaves_a_missed_week_alone_and_delivers_the_others():
    w43 = Period(2026, 43)
    clock = FixedClock(CLOSED)
    ledger = frozen_ledger(2)
    seed_period(ledger, 3, period=w43, now=w43.ends_at)
    mailer = FakeMailer(clock=clock)

    report = sweep(
        make_deliverer(ledger, mailer, clock),
        batch_size=10,
        concurrency=2,
        cleanup_mode=CleanupMode.ARCHIVE,
    )

    assert set(report.refused) == {W42}
    assert report.periods == [w43]
    assert ledger.state_counts(W42) == {DeliveryState.PENDING: 2}
    assert ledger.state_counts(w43) == {DeliveryState.CLEANED: 3}
    assert ledger.dead_letters(W42) == []
