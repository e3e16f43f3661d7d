"""The delivery gate's bounds: the window, lost races, batch and run bounds, many workers at once.

Assertions are about what is recorded and what the simulated provider delivered.
"""

import threading
from datetime import timedelta

import pytest

from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.retry import RetryPolicy
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.services.deliver import deliver_due
from digest_pipeline.services.reconcile import reconcile_period
from digest_pipeline_tests.builders import (
    deliver_all,
    failed_invariants,
    frozen_ledger,
    key_of,
    make_deliverer,
    start_one,
    state_of,
)
from digest_pipeline_tests.conftest import T0, W42
from digest_pipeline_tests.fakes import FakeMailer, FixedClock
from digest_pipeline_tests.outcomes import PERMANENT, TRANSIENT, dead_letter_reasons, throttled

# every test here on both delivery loops: a provider's pool and a local mailer's ledger thread
pytestmark = pytest.mark.usefixtures("both_mailer_kinds")


# --- the delivery window ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "after_close",
    [
        timedelta(0),  # the very instant the window closes
        timedelta(hours=5),
    ],
)
def test_claim_after_the_window_closed_is_dead_lettered_without_calling_the_mailer(
    clock, after_close
):
    policy = DeliveryPolicy()
    ledger, mailer = frozen_ledger(1), FakeMailer(clock=clock)
    clock.set(policy.closes_at(W42) + after_close)

    report = deliver_all(make_deliverer(ledger, mailer, clock, policy=policy))

    assert report.outcomes == {"dead_lettered": 1}
    assert dead_letter_reasons(ledger) == {str(key_of(1)): "window_closed"}
    assert mailer.sends == 0
    assert ledger.attempts(key_of(1)) == []
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_retry_that_would_land_after_the_window_closes_is_dead_lettered(clock):
    policy = DeliveryPolicy()
    ledger, mailer = frozen_ledger(1), FakeMailer(clock=clock)
    mailer.script(key_of(1), TRANSIENT)
    clock.set(policy.closes_at(W42) - timedelta(seconds=10))  # the retry would wait 15 s

    deliver_all(make_deliverer(ledger, mailer, clock, policy=policy))

    assert dead_letter_reasons(ledger) == {str(key_of(1)): "window_closed"}
    assert mailer.sends_for(key_of(1)) == 1


def test_item_claimed_just_before_the_window_closes_is_still_sent(clock):
    policy = DeliveryPolicy()
    ledger, mailer = frozen_ledger(1), FakeMailer(clock=clock)
    clock.set(policy.closes_at(W42) - timedelta(microseconds=1))

    deliver_all(make_deliverer(ledger, mailer, clock, policy=policy))

    assert state_of(ledger, key_of(1)) is DeliveryState.SENT


# --- lost races -------------------------------------------------------------------------------


def test_worker_whose_lease_was_taken_over_does_not_send(clock):
    ledger, mailer = frozen_ledger(1), FakeMailer(clock=clock)
    policy = DeliveryPolicy()
    [stale] = ledger.claim_due(clock.now(), "w-stale", policy.lease, limit=1)
    clock.advance(policy.lease)
    ledger.recover_expired_leases(clock.now())
    deliver_all(make_deliverer(ledger, mailer, clock, owner="w2"))

    outcome = make_deliverer(ledger, mailer, clock, owner="w-stale").deliver_one(stale)

    assert outcome == "lost_race"
    assert mailer.deliveries_for(key_of(1)) == 1
    assert mailer.sends == 1
    assert state_of(ledger, key_of(1)) is DeliveryState.SENT


# --- batching and bounds ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_items", "batch_size", "claimed"),
    [
        (3, 50, 3),  # max_items below one batch
        (5, 2, 5),  # max_items across batches; the last batch shrinks to fit
        (50, 4, 10),  # max_items above what is due: everything due
    ],
)
def test_max_items_bounds_the_claims_of_one_run(clock, max_items, batch_size, claimed):
    ledger, mailer = frozen_ledger(10), FakeMailer(clock=clock)

    report = deliver_due(
        make_deliverer(ledger, mailer, clock),
        batch_size=batch_size,
        concurrency=2,
        max_items=max_items,
    )

    assert report.claimed == claimed
    counts = ledger.state_counts(W42)
    assert (counts.get(DeliveryState.SENT, 0), counts.get(DeliveryState.PENDING, 0)) == (
        claimed,
        10 - claimed,
    )
    assert mailer.sends == claimed


@pytest.mark.parametrize("batch_size", [1, 4, 7])
def test_batch_size_bounds_each_claim(clock, batch_size):
    ledger, mailer = frozen_ledger(10), FakeMailer(clock=clock)
    batches_allowed = iter([True, False])

    report = deliver_due(
        make_deliverer(ledger, mailer, clock),
        batch_size=batch_size,
        concurrency=4,
        should_continue=lambda: next(batches_allowed),
    )

    assert report.claimed == batch_size
    assert ledger.state_counts(W42).get(DeliveryState.SENT) == batch_size


def test_should_continue_stops_before_the_first_claim(clock):
    ledger, mailer = frozen_ledger(3), FakeMailer(clock=clock)

    report = deliver_due(
        make_deliverer(ledger, mailer, clock),
        batch_size=10,
        concurrency=1,
        should_continue=lambda: False,
    )

    assert report.claimed == 0
    assert ledger.state_counts(W42) == {DeliveryState.PENDING: 3}


# --- many workers, mixed outcomes -------------------------------------------------------------


def _script_mix(mailer: FakeMailer, count: int) -> dict[str, list[int]]:
    """Scripts a tenth of the keys per behaviour; returns the customer numbers per behaviour."""
    groups: dict[str, list[int]] = {
        "transient": [],
        "throttled": [],
        "permanent": [],
        "unknown": [],
        "sent": [],
    }
    for n in range(1, count + 1):
        match n % 10:
            case 0:
                mailer.script(key_of(n), TRANSIENT)
                groups["transient"].append(n)
            case 1:
                mailer.script(key_of(n), throttled(timedelta(seconds=20)))
                groups["throttled"].append(n)
            case 2:
                mailer.script(key_of(n), PERMANENT)
                groups["permanent"].append(n)
            case 3:
                mailer.script_timeout_after_accept(key_of(n))
                groups["unknown"].append(n)
            case _:
                groups["sent"].append(n)
    return groups


def test_concurrent_workers_leave_every_item_visible_with_invariants_holding(clock):
    ledger, mailer = frozen_ledger(200), FakeMailer(clock=clock)
    groups = _script_mix(mailer, 200)

    report = deliver_due(make_deliverer(ledger, mailer, clock), batch_size=16, concurrency=8)

    assert report.claimed == 200
    assert report.lost_races == 0
    expected = {
        "transient": DeliveryState.RETRY_SCHEDULED,
        "throttled": DeliveryState.RETRY_SCHEDULED,
        "permanent": DeliveryState.FAILED,
        "unknown": DeliveryState.UNKNOWN,
        "sent": DeliveryState.SENT,
    }
    for group, numbers in groups.items():
        assert {state_of(ledger, key_of(n)) for n in numbers} == {expected[group]}, group
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_concurrent_workers_send_each_key_at_most_once_across_retries(clock):
    ledger, mailer = frozen_ledger(200), FakeMailer(clock=clock)
    groups = _script_mix(mailer, 200)
    deliverer = make_deliverer(ledger, mailer, clock)

    deliver_due(deliverer, batch_size=16, concurrency=8)
    clock.advance(timedelta(minutes=5))
    deliver_due(deliverer, batch_size=16, concurrency=8)

    delivered_once = groups["sent"] + groups["transient"] + groups["throttled"] + groups["unknown"]
    assert {mailer.deliveries_for(key_of(n)) for n in delivered_once} == {1}
    assert {mailer.deliveries_for(key_of(n)) for n in groups["permanent"]} == {0}
    assert mailer.duplicate_deliveries == 0
    assert ledger.state_counts(W42) == {
        DeliveryState.SENT: 160,
        DeliveryState.FAILED: 20,
        DeliveryState.UNKNOWN: 20,
    }
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_two_workers_sharing_the_ledger_never_send_a_key_twice(clock):
    ledger, mailer = frozen_ledger(200), FakeMailer(clock=clock)
    groups = _script_mix(mailer, 200)
    start = threading.Barrier(2)
    reports = []

    def work(owner: str) -> None:
        start.wait()
        deliverer = make_deliverer(ledger, mailer, clock, owner=owner)
        reports.append(deliver_due(deliverer, batch_size=5, concurrency=4))

    workers = [threading.Thread(target=work, args=(f"w{i}",)) for i in (1, 2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()

    assert sum(r.claimed for r in reports) == 200
    assert {mailer.sends_for(key_of(n)) for n in range(1, 201)} == {1}
    assert {mailer.deliveries_for(key_of(n)) for n in groups["sent"]} == {1}
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_fixed_clock_keeps_retry_schedules_exact_under_concurrency():
    clock = FixedClock(T0)
    ledger, mailer = frozen_ledger(40), FakeMailer(clock=clock)
    for n in range(1, 41):
        mailer.script(key_of(n), TRANSIENT)

    deliver_due(make_deliverer(ledger, mailer, clock), batch_size=8, concurrency=8)

    assert {i.next_attempt_at for i in ledger.items(W42)} == {T0 + timedelta(seconds=15)}


# --- resends of an unknown outcome ------------------------------------------------------------


@pytest.mark.parametrize("failure", [TRANSIENT, PERMANENT])
def test_resend_of_an_unknown_that_runs_out_of_bounds_is_dead_lettered_unresolved(clock, failure):
    # The first attempt timed out after the provider took it; the resends (made safe by the
    # provider's deduplication) then fail. The first may have been delivered: not `max_attempts`
    # or `permanent`, which a replay would resend blind, but `unknown_unresolved`.
    policy = DeliveryPolicy(retry=RetryPolicy(max_attempts=2))
    mailer = FakeMailer(can_lookup=False, clock=clock)
    ledger = frozen_ledger(1)
    mailer.script_timeout_after_accept(key_of(1))
    mailer.script(key_of(1), failure, failure)
    deliverer = make_deliverer(ledger, mailer, clock, policy=policy)
    deliver_all(deliverer)
    reconcile_period(ledger, mailer, clock, policy, W42)
    resend = ledger.get(key_of(1))
    assert resend is not None
    assert resend.dedupe_until is not None

    for _ in range(3):
        deliver_all(deliverer)
        clock.advance(timedelta(minutes=5))

    assert state_of(ledger, key_of(1)) is DeliveryState.DEAD_LETTERED
    [dead] = ledger.dead_letters(W42)
    assert dead.reason == "unknown_unresolved"
    assert mailer.deliveries_for(key_of(1)) == 1
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_claim_released_after_a_lost_start_is_never_requeued_with_an_attempt_in_flight(clock):
    ledger, mailer = frozen_ledger(1), FakeMailer(clock=clock)
    policy = DeliveryPolicy()
    [claim] = ledger.claim_due(clock.now(), "w1", policy.lease, limit=1)
    start_one(ledger, claim, clock.now())  # a send under this very token is in flight
    clock.advance(policy.lease)  # the lease runs out before the sweeper has run

    outcome = make_deliverer(ledger, mailer, clock, owner="w1").deliver_one(claim)

    assert outcome == "lost_race"
    assert state_of(ledger, key_of(1)) is DeliveryState.CLAIMED  # left for the sweeper: → unknown
    assert ledger.recover_expired_leases(clock.now()).unknown == (key_of(1),)
    assert mailer.sends == 0
