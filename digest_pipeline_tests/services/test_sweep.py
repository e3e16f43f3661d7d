"""The periodic sweep: expired leases, reconciliation, due retries and cleanup in one pass."""

from datetime import timedelta

import pytest

from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import CleanupMode, Message
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.services.deliver import Deliverer, deliver_due
from digest_pipeline.services.pipeline import SweepReport, sweep
from digest_pipeline_tests.builders import (
    deliver_all,
    failed_invariants,
    frozen_ledger,
    key_of,
    make_deliverer,
    rows_of,
    state_of,
)
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.fakes import FakeLedger, FakeMailer, FixedClock, WorkerCrash

# every test here on both delivery loops: a provider's pool and a local mailer's ledger thread
pytestmark = pytest.mark.usefixtures("both_mailer_kinds")

POLICY = DeliveryPolicy()
W43 = Period(2026, 43)


def run_sweep(deliverer: Deliverer, mode: CleanupMode | None = CleanupMode.ARCHIVE) -> SweepReport:
    return sweep(deliverer, batch_size=20, concurrency=4, cleanup_mode=mode)


def snapshot_of(ledger: FakeLedger, mailer: FakeMailer) -> tuple[object, ...]:
    """Everything a sweep could change."""
    return (
        ledger.items(W42),
        ledger.items(W43),
        ledger.audit_log(),
        ledger.dead_letters(W42),
        ledger.cleanups,
        ledger.archived_rows,
        mailer.sends,
    )


def test_claim_that_never_started_an_attempt_is_requeued_and_delivered(clock):
    ledger, mailer = frozen_ledger(1), FakeMailer(clock=clock)
    ledger.claim_due(clock.now(), "w-dead", POLICY.lease, limit=1)
    clock.advance(POLICY.lease)

    report = run_sweep(make_deliverer(ledger, mailer, clock, policy=POLICY))

    assert (report.recovered.requeued, report.recovered.unknown) == ((key_of(1),), ())
    assert state_of(ledger, key_of(1)) is DeliveryState.CLEANED
    assert mailer.deliveries_for(key_of(1)) == 1
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_lease_that_has_not_expired_is_left_to_its_worker(clock):
    ledger, mailer = frozen_ledger(1), FakeMailer(clock=clock)
    ledger.claim_due(clock.now(), "w-busy", POLICY.lease, limit=1)
    clock.advance(POLICY.lease - timedelta(seconds=1))

    report = run_sweep(make_deliverer(ledger, mailer, clock, policy=POLICY))

    assert report.recovered.requeued == ()
    assert state_of(ledger, key_of(1)) is DeliveryState.CLAIMED
    assert mailer.sends == 0


def crashed_after_accept(clock: FixedClock, mailer: FakeMailer) -> FakeLedger:
    """The worker died right after the provider accepted customer 1's digest."""
    ledger = frozen_ledger(1)
    mailer.script_crash_after_accept(key_of(1))
    with pytest.raises(WorkerCrash):
        deliver_all(make_deliverer(ledger, mailer, clock, policy=POLICY))
    assert state_of(ledger, key_of(1)) is DeliveryState.CLAIMED
    return ledger


def test_crash_with_an_open_attempt_becomes_unknown_then_is_reconciled_by_lookup(clock):
    mailer = FakeMailer(clock=clock)
    ledger = crashed_after_accept(clock, mailer)
    clock.advance(POLICY.lease)

    report = run_sweep(make_deliverer(ledger, mailer, clock, policy=POLICY))

    assert report.recovered.unknown == (key_of(1),)
    assert report.reconciled[W42].evidence == {"mailer_lookup_found": 1}
    assert state_of(ledger, key_of(1)) is DeliveryState.CLEANED
    assert mailer.deliveries_for(key_of(1)) == 1
    assert mailer.sends == 1
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_crash_with_an_open_attempt_stays_unknown_without_evidence(clock):
    mailer = FakeMailer(idempotent=False, can_lookup=False, clock=clock)
    ledger = crashed_after_accept(clock, mailer)
    clock.advance(POLICY.lease)

    run_sweep(make_deliverer(ledger, mailer, clock, policy=POLICY))

    assert state_of(ledger, key_of(1)) is DeliveryState.UNKNOWN
    assert len(rows_of(ledger, key_of(1))) == 2
    assert mailer.sends == 1
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_unknown_the_provider_never_got_is_reconciled_and_delivered_in_one_pass(clock):
    ledger, mailer = frozen_ledger(1), FakeMailer(clock=clock)
    mailer.script(key_of(1), SendOutcome.failed(FailureClass.UNKNOWN, "timeout_after_send"))
    deliver_all(make_deliverer(ledger, mailer, clock, policy=POLICY))

    report = run_sweep(make_deliverer(ledger, mailer, clock, policy=POLICY))

    assert report.reconciled[W42].evidence == {"mailer_lookup_not_found": 1}
    assert state_of(ledger, key_of(1)) is DeliveryState.CLEANED
    assert mailer.deliveries_for(key_of(1)) == 1


def test_due_retries_are_delivered_and_cleaned(clock):
    ledger, mailer = frozen_ledger(3), FakeMailer(clock=clock)
    mailer.script(key_of(2), SendOutcome.failed(FailureClass.TRANSIENT, "smtp:421"))
    deliverer = make_deliverer(ledger, mailer, clock, policy=POLICY)
    deliver_all(deliverer)
    clock.advance(timedelta(minutes=1))

    report = run_sweep(deliverer)

    assert report.delivered.outcomes == {"sent": 1}
    assert ledger.state_counts(W42) == {DeliveryState.CLEANED: 3}
    assert report.cleaned[W42].cleaned == 3


def test_retries_not_yet_due_wait_for_a_later_sweep(clock):
    ledger, mailer = frozen_ledger(1), FakeMailer(clock=clock)
    mailer.script(key_of(1), SendOutcome.failed(FailureClass.TRANSIENT, "smtp:421"))
    deliverer = make_deliverer(ledger, mailer, clock, policy=POLICY)
    deliver_all(deliverer)

    report = run_sweep(deliverer)

    assert report.delivered.claimed == 0
    assert state_of(ledger, key_of(1)) is DeliveryState.RETRY_SCHEDULED


def test_sweep_covers_every_open_period(clock):
    ledger, mailer = frozen_ledger(2), FakeMailer(clock=clock)
    frozen_ledger(3, period=W43, ledger=ledger)

    report = run_sweep(make_deliverer(ledger, mailer, clock, policy=POLICY))

    assert report.periods == [W42, W43]
    assert (ledger.state_counts(W42), ledger.state_counts(W43)) == (
        {DeliveryState.CLEANED: 2},
        {DeliveryState.CLEANED: 3},
    )


def test_sweep_without_cleanup_mode_leaves_sent_items_for_the_asset_graph(clock):
    ledger, mailer = frozen_ledger(2), FakeMailer(clock=clock)

    report = run_sweep(make_deliverer(ledger, mailer, clock, policy=POLICY), mode=None)

    assert report.cleaned == {}
    assert ledger.state_counts(W42) == {DeliveryState.SENT: 2}


def mixed_open_period(clock: FixedClock, mailer: FakeMailer) -> FakeLedger:
    """Expired claim, crash after accept, transient, permanent, unresolvable unknown, sent."""
    ledger = frozen_ledger(7)
    mailer.script_crash_after_accept(key_of(2))
    mailer.script(key_of(3), SendOutcome.failed(FailureClass.TRANSIENT, "smtp:421"))
    mailer.script(key_of(4), SendOutcome.failed(FailureClass.PERMANENT, "smtp:550"))
    mailer.script(key_of(5), SendOutcome.failed(FailureClass.UNKNOWN, "timeout_after_send"))
    ledger.claim_due(clock.now(), "w-dead", POLICY.lease, limit=1)  # customer 1
    with pytest.raises(WorkerCrash):
        # one claim only: a run would otherwise have taken the next claim ahead
        # (customer 3) by the time it crashes, and left it leased until the sweep
        deliver_due(
            make_deliverer(ledger, mailer, clock, policy=POLICY),
            batch_size=1,
            concurrency=1,
            max_items=1,
        )
    deliver_all(make_deliverer(ledger, mailer, clock, policy=POLICY))
    clock.advance(POLICY.lease)
    return ledger


def test_sweep_settles_a_mixed_period_with_invariants_holding(clock):
    mailer = FakeMailer(clock=clock)
    ledger = mixed_open_period(clock, mailer)

    run_sweep(make_deliverer(ledger, mailer, clock, policy=POLICY))

    assert {n: state_of(ledger, key_of(n)) for n in range(1, 8)} == {
        1: DeliveryState.CLEANED,
        2: DeliveryState.CLEANED,
        3: DeliveryState.CLEANED,
        4: DeliveryState.FAILED,
        5: DeliveryState.CLEANED,
        6: DeliveryState.CLEANED,
        7: DeliveryState.CLEANED,
    }
    assert mailer.duplicate_deliveries == 0
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_second_sweep_changes_nothing(clock):
    mailer = FakeMailer(clock=clock)
    ledger = mixed_open_period(clock, mailer)
    deliverer = make_deliverer(ledger, mailer, clock, policy=POLICY)
    run_sweep(deliverer)
    before = snapshot_of(ledger, mailer)

    report = run_sweep(deliverer)

    assert snapshot_of(ledger, mailer) == before
    assert (report.recovered.requeued, report.recovered.unknown) == ((), ())
    assert report.delivered.claimed == 0


class SlowMailer(FakeMailer):
    """Every send takes a minute of (fixed-clock) time."""

    def __init__(self, clock: FixedClock) -> None:
        super().__init__(clock=clock)
        self._time = clock

    def send(self, message: Message, *, idempotency_key: str) -> SendOutcome:
        self._time.advance(timedelta(minutes=1))
        return super().send(message, idempotency_key=idempotency_key)


def test_worker_returns_only_after_every_claim_it_took_has_a_visible_state(clock):
    # a batch of four one-minute sends under a two-minute lease: the last two claims expire
    ledger, mailer = frozen_ledger(4), SlowMailer(clock)
    deliverer = make_deliverer(ledger, mailer, clock, policy=POLICY)

    deliver_due(deliverer, batch_size=4, concurrency=1)

    assert DeliveryState.CLAIMED not in ledger.state_counts(W42)
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_sweep_delivers_claims_that_expired_in_a_slow_batch_exactly_once(clock):
    ledger, mailer = frozen_ledger(4), SlowMailer(clock)
    deliverer = make_deliverer(ledger, mailer, clock, policy=POLICY)
    deliver_due(deliverer, batch_size=4, concurrency=1)

    sweep(deliverer, batch_size=1, concurrency=1)

    assert ledger.state_counts(W42) == {DeliveryState.CLEANED: 4}
    assert {mailer.deliveries_for(key_of(n)) for n in range(1, 5)} == {1}
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_sweep_with_nothing_open_does_nothing(clock):
    ledger, mailer = FakeLedger(), FakeMailer(clock=clock)

    report = run_sweep(make_deliverer(ledger, mailer, clock, policy=POLICY))

    assert (report.periods, report.delivered.claimed) == ([], 0)
