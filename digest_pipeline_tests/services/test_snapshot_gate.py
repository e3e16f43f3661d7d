"""Every path that delivers or cleans a period checks its frozen snapshot first.

A snapshot edited after the freeze (a bad migration, a hand edit of a recipient) must not be sent
to, or cleaned: the worker refuses the period before it claims anything, a claim of it taken
earlier is given back unsent, and the sweep reports it and goes on with the other periods.
"""

from datetime import timedelta

import pytest

from digest_pipeline.domain.errors import SnapshotTampered
from digest_pipeline.domain.model import CleanupMode
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.services.cleanup import clean_period
from digest_pipeline.services.deliver import deliver_due
from digest_pipeline.services.pipeline import sweep
from digest_pipeline_tests.builders import (
    deliver_all,
    frozen_ledger,
    key_of,
    make_deliverer,
    recipient_of,
    rows_of,
    seed_period,
    state_of,
)
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.fakes import FakeLedger, FakeMailer

# every test here on both delivery loops: a provider's pool and a local mailer's ledger thread
pytestmark = pytest.mark.usefixtures("both_mailer_kinds")

W43 = Period(2026, 43)
TAMPERED = "tampered@example.com"
POLICY = DeliveryPolicy()


class CountingLedger(FakeLedger):
    """The fake ledger, counting how often the snapshot was fingerprinted."""

    def __init__(self) -> None:
        super().__init__()
        self.fingerprints = 0

    def check_invariants(self, period, now, names=None):
        self.fingerprints += names is None or "snapshot_unchanged" in names
        return super().check_invariants(period, now, names)


def tampered(count: int = 3) -> FakeLedger:
    ledger = frozen_ledger(count)
    ledger.tamper_snapshot(W42, "customer-0002", TAMPERED)
    return ledger


def assert_refusal(error: SnapshotTampered, period: Period = W42) -> None:
    text = str(error)
    assert f"period {period}" in text
    assert "snapshot" in text
    assert "@" not in text  # never an address
    assert "\n" not in text
    assert error.period == str(period)


@pytest.mark.parametrize("period", [W42, None], ids=["one_period", "every_open_period"])
def test_a_worker_refuses_a_tampered_period_before_claiming_anything(clock, period):
    ledger, mailer = tampered(), FakeMailer(clock=clock)
    before = ledger.items(W42)

    with pytest.raises(SnapshotTampered) as refused:
        deliver_due(
            make_deliverer(ledger, mailer, clock), batch_size=10, concurrency=2, period=period
        )

    assert_refusal(refused.value)
    assert mailer.sends == 0
    assert ledger.items(W42) == before  # untouched: never claimed


def test_a_claim_taken_before_the_tamper_is_given_back_unsent(clock):
    ledger, mailer = frozen_ledger(2), FakeMailer(clock=clock)
    [claim] = ledger.claim_due(clock.now(), "w-early", POLICY.lease, limit=1)
    ledger.tamper_snapshot(W42, claim.key.customer_id, TAMPERED)

    with pytest.raises(SnapshotTampered) as refused:
        make_deliverer(ledger, mailer, clock, owner="w-early").deliver_one(claim)

    assert_refusal(refused.value)
    assert mailer.sends == 0
    item = ledger.get(claim.key)
    assert item is not None
    assert (item.state, item.attempts) == (DeliveryState.RETRY_SCHEDULED, 0)
    assert item.next_attempt_at == clock.now()  # still due, once the snapshot is restored
    assert ledger.attempts(claim.key) == []


def test_a_worker_fingerprints_the_snapshot_once_a_lease_not_once_a_claim(clock):
    ledger, mailer = CountingLedger(), FakeMailer(clock=clock)
    seed_period(ledger, 40, now=clock.now())
    deliverer = make_deliverer(ledger, mailer, clock)

    report = deliver_due(deliverer, batch_size=4, concurrency=2, period=W42)

    assert report.outcomes == {"sent": 40}
    assert ledger.fingerprints == 1  # ten claims, one fingerprint
    clock.advance(POLICY.lease)
    deliver_due(deliverer, batch_size=4, concurrency=2, period=W42)
    assert ledger.fingerprints == 2


def test_a_period_tampered_after_the_worker_checked_it_is_refused_at_the_next_lease(clock):
    ledger, mailer = frozen_ledger(4), FakeMailer(clock=clock)
    deliverer = make_deliverer(ledger, mailer, clock)
    deliver_due(deliverer, batch_size=4, concurrency=1, period=W42, max_items=1)
    ledger.tamper_snapshot(W42, "customer-0003", TAMPERED)
    clock.advance(POLICY.lease)

    with pytest.raises(SnapshotTampered):
        deliver_due(deliverer, batch_size=4, concurrency=1, period=W42)

    assert mailer.sends == 1
    assert [state_of(ledger, key_of(n)) for n in (2, 3, 4)] == [DeliveryState.PENDING] * 3


def test_cleanup_refuses_a_tampered_period_and_cleans_nothing(clock):
    ledger, mailer = frozen_ledger(3), FakeMailer(clock=clock)
    deliver_all(make_deliverer(ledger, mailer, clock))
    ledger.tamper_snapshot(W42, "customer-0001", TAMPERED)

    with pytest.raises(SnapshotTampered) as refused:
        clean_period(ledger, clock, W42, CleanupMode.ARCHIVE)

    assert_refusal(refused.value)
    assert ledger.cleanups == []
    assert [state_of(ledger, key_of(n)) for n in (1, 2, 3)] == [DeliveryState.SENT] * 3
    assert all(rows_of(ledger, key_of(n)) for n in (1, 2, 3))


def test_a_sweep_reports_a_tampered_period_and_goes_on_with_the_others(clock):
    ledger, mailer = frozen_ledger(3), FakeMailer(clock=clock)
    seed_period(ledger, 2, period=W43, now=clock.now())
    ledger.tamper_snapshot(W42, "customer-0002", TAMPERED)
    before = ledger.items(W42)

    report = sweep(
        make_deliverer(ledger, mailer, clock), batch_size=10, concurrency=2, breaker_threshold=20
    )

    assert list(report.refused) == [W42]
    assert "period 2026-W42" in report.refused[W42]
    assert report.periods == [W43]
    assert ledger.items(W42) == before
    assert all(m.key.period == W43 for m in mailer.sent_messages)
    assert TAMPERED not in [m.recipient for m in mailer.sent_messages]
    assert [state_of(ledger, key_of(n, W43)) for n in (1, 2)] == [DeliveryState.CLEANED] * 2
    assert W42 not in report.cleaned


def test_a_restored_snapshot_is_delivered_by_the_next_worker(clock):
    ledger, mailer = frozen_ledger(2), FakeMailer(clock=clock)
    original = recipient_of(ledger, key_of(2))
    assert original is not None
    ledger.tamper_snapshot(W42, "customer-0002", TAMPERED)
    with pytest.raises(SnapshotTampered):
        deliver_all(make_deliverer(ledger, mailer, clock), period=W42)

    ledger.tamper_snapshot(W42, "customer-0002", original)  # the operator restores it
    clock.advance(timedelta(seconds=1))
    report = deliver_all(make_deliverer(ledger, mailer, clock), period=W42)

    assert report.outcomes == {"sent": 2}
