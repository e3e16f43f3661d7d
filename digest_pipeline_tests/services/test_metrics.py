"""The period's numbers, read from the ledger, under a controlled clock."""

from collections.abc import Iterable, Iterator
from dataclasses import replace
from datetime import timedelta

import pytest

from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import CleanupMode, WorkItem
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.retry import RetryPolicy
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.domain.timing import percentile
from digest_pipeline.services.cleanup import clean_period
from digest_pipeline.services.deliver import deliver_due
from digest_pipeline.services.metrics import cleanup_figures, period_metrics
from digest_pipeline.services.reconcile import reconcile_period
from digest_pipeline_tests.builders import (
    deliver_all,
    failed_invariants,
    frozen_ledger,
    key_of,
    make_deliverer,
)
from digest_pipeline_tests.conftest import T0, W42
from digest_pipeline_tests.fakes import FakeLedger, FakeMailer, FixedClock

TRANSIENT = SendOutcome.failed(FailureClass.TRANSIENT, "smtp:421")
PERMANENT = SendOutcome.failed(FailureClass.PERMANENT, "smtp:550")


def four_customers(clock: FixedClock) -> FakeLedger:
    """1 transient then sent, 2 and 3 sent, 4 permanent: five finished attempts."""
    ledger, mailer = frozen_ledger(4), FakeMailer(clock=clock)
    mailer.script(key_of(1), TRANSIENT)
    mailer.script(key_of(4), PERMANENT)
    deliverer = make_deliverer(ledger, mailer, clock)
    deliver_all(deliverer)
    clock.advance(timedelta(minutes=10))
    deliver_all(deliverer)
    return ledger


# --- percentile -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([], 50, None),  # nothing measured
        ([7.0], 0, 7.0),  # one value is every percentile
        ([7.0], 50, 7.0),
        ([7.0], 100, 7.0),
        ([3.0, 1.0, 2.0], 0, 1.0),  # q=0 is the minimum (rank clamps to 1)
        ([3.0, 1.0, 2.0], 100, 3.0),  # q=100 is the maximum
        ([4.0, 1.0, 3.0, 2.0], 50, 2.0),  # nearest rank: ceil(4 * 0.5) = 2nd value, no averaging
        ([float(v) for v in range(1, 11)], 90, 9.0),  # ceil(10 * 0.9) = 9th
        ([float(v) for v in range(1, 11)], 91, 10.0),  # ceil(9.1) = 10th
        ([float(v) for v in range(1, 21)], 95, 19.0),  # exactly on a rank
        ([float(v) for v in range(1, 101)], 99.5, 100.0),  # fractional q rounds up
        ([2.0, 2.0, 2.0, 9.0], 75, 2.0),  # ties
    ],
)
def test_percentile_is_nearest_rank(values, q, expected):
    assert percentile(values, q) == expected


def test_percentile_does_not_reorder_its_input():
    values = [3.0, 1.0, 2.0]

    percentile(values, 50)

    assert values == [3.0, 1.0, 2.0]


# --- period metrics ---------------------------------------------------------------------------


def test_counts_by_state(clock):
    ledger = four_customers(clock)

    metrics = period_metrics(ledger, W42, clock.now())

    assert metrics.by_state == {"sent": 3, "failed": 1}
    assert (metrics.eligible, metrics.attempts, metrics.finished_attempts) == (4, 5, 5)


def test_delivered_counts_sent_and_cleaned_items_over_eligible(clock):
    ledger = four_customers(clock)
    before = period_metrics(ledger, W42, clock.now())
    clean_period(ledger, clock, W42, CleanupMode.ARCHIVE)

    after = period_metrics(ledger, W42, clock.now())

    assert (before.delivered, before.delivered_fraction) == (3, 0.75)
    assert after.by_state == {"cleaned": 3, "failed": 1}
    assert (after.delivered, after.delivered_fraction) == (3, 0.75)
    assert after.as_flat_dict()["delivered_fraction"] == 0.75


def test_cleanup_figures_are_the_flat_metrics_of_the_same_names(clock):
    ledger = four_customers(clock)
    clock.advance(timedelta(minutes=90))
    clean_period(ledger, clock, W42, CleanupMode.ARCHIVE)

    figures = cleanup_figures(ledger, W42)
    flat = period_metrics(ledger, W42, clock.now()).as_flat_dict()

    assert figures == {name: flat[name] for name in figures}
    assert (figures["cleaned"], figures["delivered"]) == (3, 3)
    assert figures["cleanup_lag_max_s"] is not None


def test_delivered_fraction_is_absent_when_nobody_is_eligible(clock):
    metrics = period_metrics(frozen_ledger(0), W42, clock.now())

    assert (metrics.delivered, metrics.delivered_fraction) == (0, None)


def test_failure_share_is_failed_attempts_of_a_class_over_finished_attempts(clock):
    ledger = four_customers(clock)

    metrics = period_metrics(ledger, W42, clock.now())

    assert metrics.failure_share == {
        "transient": pytest.approx(1 / 5),
        "throttled": 0.0,
        "permanent": pytest.approx(1 / 5),
        "unknown": 0.0,
    }


def test_failure_shares_are_zero_before_any_attempt(clock):
    ledger = frozen_ledger(2)

    metrics = period_metrics(ledger, W42, clock.now())

    assert set(metrics.failure_share.values()) == {0.0}
    assert metrics.attempts == 0


def test_enqueue_to_claim_percentiles_follow_the_clock(clock):
    ledger, mailer = frozen_ledger(4), FakeMailer(clock=clock)
    deliverer = make_deliverer(ledger, mailer, clock)
    for _ in range(4):  # one claim every 10 s: delays 0, 10, 20, 30
        deliver_due(deliverer, batch_size=1, concurrency=1, max_items=1)
        clock.advance(timedelta(seconds=10))

    metrics = period_metrics(ledger, W42, clock.now())

    assert (metrics.enqueue_to_claim_p50_s, metrics.enqueue_to_claim_p95_s) == (10.0, 30.0)


class EnqueuedApart(FakeLedger):
    """A ledger whose items were enqueued `gap` apart, customer 1 first.

    Both real ledgers enqueue a period in one statement, so only a fake gives each item its own
    enqueue time; the metric must measure every item from its own.
    """

    def __init__(self, gap: timedelta) -> None:
        super().__init__()
        self._gap = gap

    def iter_items(
        self, period: Period, states: Iterable[DeliveryState] | None = None, page: int = 1_000
    ) -> Iterator[WorkItem]:
        for i in super().iter_items(period, states, page):
            n = int(i.customer_id.rsplit("-", 1)[1])
            yield replace(i, created_at=i.created_at + (n - 1) * self._gap)


def test_enqueue_to_claim_is_per_item_from_its_own_enqueue_not_per_claim_batch(clock):
    # enqueued at T0, T0 + 10 s, T0 + 20 s; all three claimed in one batch at T0 + 30 s
    ledger = frozen_ledger(3, ledger=EnqueuedApart(timedelta(seconds=10)))
    clock.advance(timedelta(seconds=30))
    deliver_due(make_deliverer(ledger, FakeMailer(clock=clock), clock), batch_size=3, concurrency=4)
    assert {i.first_claimed_at for i in ledger.items(W42)} == {clock.now()}

    metrics = period_metrics(ledger, W42, clock.now())

    # delays 30, 20 and 10 s (a per-batch figure would be 30 s for all three)
    assert (metrics.enqueue_to_claim_p50_s, metrics.enqueue_to_claim_p95_s) == (20.0, 30.0)


def test_enqueue_to_claim_counts_the_first_claim_not_the_retry(clock):
    ledger, mailer = frozen_ledger(1), FakeMailer(clock=clock)
    mailer.script(key_of(1), TRANSIENT)
    deliverer = make_deliverer(ledger, mailer, clock)
    clock.advance(timedelta(seconds=5))
    deliver_all(deliverer)
    clock.advance(timedelta(minutes=5))
    deliver_all(deliverer)

    metrics = period_metrics(ledger, W42, clock.now())

    assert metrics.enqueue_to_claim_p95_s == 5.0


def test_oldest_pending_age_is_measured_from_enqueue(clock):
    ledger = frozen_ledger(2)
    clock.advance(timedelta(minutes=3))

    metrics = period_metrics(ledger, W42, clock.now())

    assert metrics.oldest_pending_age_s == 180.0


def test_duplicates_suppressed_counts_idempotent_resends(clock):
    ledger = frozen_ledger(2)
    mailer = FakeMailer(can_lookup=False, idempotency_window=timedelta(hours=24), clock=clock)
    mailer.script_timeout_after_accept(key_of(1))
    deliverer = make_deliverer(ledger, mailer, clock)
    deliver_all(deliverer)
    reconcile_period(ledger, mailer, clock, DeliveryPolicy(), W42)
    deliver_all(deliverer)

    metrics = period_metrics(ledger, W42, clock.now())

    assert (metrics.duplicates_suppressed, metrics.duplicate_sends) == (1, 0)
    assert mailer.duplicate_deliveries == 0
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_duplicate_sends_is_zero_after_a_mixed_run(clock):
    ledger = four_customers(clock)

    assert period_metrics(ledger, W42, clock.now()).duplicate_sends == 0


def test_cleanup_lag_runs_from_sent_to_cleaned(clock):
    # customer 1 is sent at T0 + 10 min after a retry, customer 2 at T0; both cleaned at T0 + 1 h
    ledger, mailer = frozen_ledger(2), FakeMailer(clock=clock)
    mailer.script(key_of(1), TRANSIENT)
    deliverer = make_deliverer(ledger, mailer, clock)
    deliver_all(deliverer)
    clock.advance(timedelta(minutes=10))
    deliver_all(deliverer)
    clock.set(T0 + timedelta(hours=1))
    clean_period(ledger, clock, W42, CleanupMode.ARCHIVE)

    metrics = period_metrics(ledger, W42, clock.now())

    assert (metrics.cleanup_lag_p50_s, metrics.cleanup_lag_max_s) == (3000.0, 3600.0)


def test_cleanup_lag_is_absent_before_cleanup(clock):
    ledger = four_customers(clock)

    metrics = period_metrics(ledger, W42, clock.now())

    assert (metrics.cleanup_lag_p50_s, metrics.cleanup_lag_max_s) == (None, None)


def test_dead_letters_are_counted_by_reason(clock):
    ledger, mailer = frozen_ledger(4), FakeMailer(clock=clock)
    mailer.script(key_of(1), PERMANENT)
    mailer.script(key_of(2), TRANSIENT)
    mailer.script(key_of(3), TRANSIENT)
    policy = DeliveryPolicy(retry=RetryPolicy(max_attempts=1))
    deliver_all(make_deliverer(ledger, mailer, clock, policy=policy))

    metrics = period_metrics(ledger, W42, clock.now())

    assert metrics.dead_letters == {"permanent": 1, "max_attempts": 2}
    flat = metrics.as_flat_dict()
    # a permanent failure is recorded as a dead letter but its item's state is `failed`
    assert (flat["dead_letters_recorded"], flat["dead_lettered"], flat["failed"]) == (3, 2, 1)


def test_flat_metrics_name_every_state_even_when_empty(clock):
    ledger = four_customers(clock)

    flat = period_metrics(ledger, W42, clock.now()).as_flat_dict()

    assert {s.value: flat[s.value] for s in DeliveryState} == {
        "pending": 0,
        "claimed": 0,
        "sent": 3,
        "cleaned": 0,
        "retry_scheduled": 0,
        "unknown": 0,
        "failed": 1,
        "dead_lettered": 0,
        "suppressed": 0,
    }
    assert flat["period"] == "2026-W42"
    assert flat["transient_attempts_fraction"] == pytest.approx(0.2)
    assert flat["transient_attempts_pct"] == "20.0 % of 5 finished attempts"
    assert sum(int(flat[s.value] or 0) for s in DeliveryState) == flat["work_items"] == 4


def test_metrics_of_a_period_without_snapshot_are_empty(clock):
    metrics = period_metrics(FakeLedger(), W42, clock.now())

    assert (metrics.eligible, metrics.by_state, metrics.attempts) == (0, {}, 0)
    assert metrics.enqueue_to_claim_p50_s is None
