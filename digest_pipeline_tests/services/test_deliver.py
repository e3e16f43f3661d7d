"""The delivery gate over the fakes: each failure class leads to the state design §2 names.

Assertions are about what is recorded (states, schedules, dead letters, invariants) and what the
simulated provider actually delivered, not about how often a method was called.
"""

import threading
from collections.abc import Callable, Sequence
from datetime import timedelta

import pytest

from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import (
    DigestRow,
    MailerCapabilities,
    Message,
    WorkItem,
    message_id_for,
)
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.retry import RetryPolicy
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.domain.waves import AHEAD_WAVES, wave_shape
from digest_pipeline.ports import Mailer
from digest_pipeline.services.deliver import deliver_due
from digest_pipeline.services.reconcile import reconcile_period
from digest_pipeline_tests.builders import (
    deliver_all,
    email_of,
    failed_invariants,
    frozen_ledger,
    key_of,
    make_deliverer,
    start_one,
    state_of,
)
from digest_pipeline_tests.conftest import T0, W42
from digest_pipeline_tests.fakes import FakeComposer, FakeMailer, FixedClock

# every test here on both delivery loops: a provider's pool and a local mailer's ledger thread
pytestmark = pytest.mark.usefixtures("both_mailer_kinds")

TRANSIENT = SendOutcome.failed(FailureClass.TRANSIENT, "smtp:421")
PERMANENT = SendOutcome.failed(FailureClass.PERMANENT, "smtp:550")


def throttled(retry_after: timedelta | None) -> SendOutcome:
    return SendOutcome.failed(FailureClass.THROTTLED, "http:429", retry_after=retry_after)


class RaisingMailer(Mailer):
    """A mailer that breaks its contract and raises an ordinary exception from `send`."""

    def __init__(self) -> None:
        self.calls = 0

    @property
    def capabilities(self) -> MailerCapabilities:
        return MailerCapabilities(idempotency_window=None, can_lookup=False)

    def send(self, message: Message, *, idempotency_key: str) -> SendOutcome:
        self.calls += 1
        raise ConnectionResetError("peer went away")


class BrokenComposer(FakeComposer):
    """A composer that breaks the port's contract: a bug raises KeyError, not RenderError."""

    def __init__(self, broken_for: str) -> None:
        super().__init__()
        self._broken_for = broken_for

    def compose(self, item: WorkItem, recipient: str, rows: Sequence[DigestRow]) -> Message:
        if item.customer_id == self._broken_for:
            raise KeyError("title")
        return super().compose(item, recipient, rows)


def dead_letter_reasons(ledger) -> dict[str, str]:
    return {str(d.key): d.reason for d in ledger.dead_letters(W42)}


# --- the happy path ---------------------------------------------------------------------------


def test_every_item_is_sent_exactly_once_on_the_happy_path(clock):
    ledger, mailer = frozen_ledger(5), FakeMailer(clock=clock)

    report = deliver_all(make_deliverer(ledger, mailer, clock))

    assert report.outcomes == {"sent": 5}
    assert ledger.state_counts(W42) == {DeliveryState.SENT: 5}
    assert [mailer.deliveries_for(key_of(n)) for n in range(1, 6)] == [1] * 5
    assert mailer.duplicate_deliveries == 0
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_message_idempotency_key_is_the_operation_key(clock):
    ledger, mailer = frozen_ledger(1), FakeMailer(clock=clock)

    deliver_all(make_deliverer(ledger, mailer, clock))

    [(idempotency_key, _, message)] = mailer.deliveries
    assert idempotency_key == str(message.key) == "digest:2026-W42:customer-0001"


def test_message_carries_message_id_and_operation_key_headers(clock):
    ledger, mailer = frozen_ledger(1), FakeMailer(clock=clock)

    deliver_all(make_deliverer(ledger, mailer, clock))

    headers = dict(mailer.sent_messages[0].headers)
    assert headers == {
        "Message-ID": message_id_for(key_of(1)),
        "X-Digest-Operation-Key": str(key_of(1)),
    }


def test_message_goes_to_the_address_frozen_in_the_snapshot(clock):
    ledger, mailer = frozen_ledger(1), FakeMailer(clock=clock)

    deliver_all(make_deliverer(ledger, mailer, clock))

    assert mailer.sent_messages[0].recipient == email_of(1)


def test_sent_item_records_the_provider_message_id_and_a_closed_attempt(clock):
    ledger, mailer = frozen_ledger(1), FakeMailer(clock=clock)

    deliver_all(make_deliverer(ledger, mailer, clock))

    item = ledger.get(key_of(1))
    assert item is not None
    assert (item.state, item.provider_message_id, item.sent_at, item.attempts) == (
        DeliveryState.SENT,
        "msg-1",
        T0,
        1,
    )
    [attempt] = ledger.attempts(key_of(1))
    assert (attempt.outcome, attempt.finished_at, attempt.worker) == ("sent", T0, "w1")


def test_a_second_run_sends_nothing_more(clock):
    ledger, mailer = frozen_ledger(5), FakeMailer(clock=clock)
    deliverer = make_deliverer(ledger, mailer, clock)
    deliver_all(deliverer)
    clock.advance(timedelta(days=1))

    report = deliver_all(deliverer)

    assert report.claimed == 0
    assert mailer.sends == 5
    assert mailer.duplicate_deliveries == 0


def test_delivery_is_limited_to_the_requested_period(clock):
    ledger = frozen_ledger(2)
    frozen_ledger(3, period=Period(2026, 43), ledger=ledger)
    mailer = FakeMailer(clock=clock)

    deliver_all(make_deliverer(ledger, mailer, clock), period=W42)

    assert ledger.state_counts(W42) == {DeliveryState.SENT: 2}
    assert ledger.state_counts(Period(2026, 43)) == {DeliveryState.PENDING: 3}


# --- transient --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("draw", "delay"),
    [
        (0.5, timedelta(seconds=15)),  # half of the first bound (the 30 s base)
        (0.25, timedelta(seconds=7.5)),
        (0.999, timedelta(seconds=29.97)),  # just under the bound
    ],
)
def test_transient_failure_schedules_retry_after_the_exact_jittered_delay(clock, draw, delay):
    ledger, mailer = frozen_ledger(1), FakeMailer(clock=clock)
    mailer.script(key_of(1), TRANSIENT)

    deliver_all(make_deliverer(ledger, mailer, clock, rand=lambda: draw))

    item = ledger.get(key_of(1))
    assert item is not None
    assert (item.state, item.next_attempt_at) == (DeliveryState.RETRY_SCHEDULED, T0 + delay)
    assert (item.last_failure_class, item.last_detail, item.budget_used) == (
        FailureClass.TRANSIENT,
        "smtp:421",
        1,
    )


def test_transient_retry_is_not_claimed_before_it_is_due(clock):
    ledger, mailer = frozen_ledger(1), FakeMailer(clock=clock)
    mailer.script(key_of(1), TRANSIENT)
    deliverer = make_deliverer(ledger, mailer, clock)
    deliver_all(deliverer)
    clock.advance(timedelta(seconds=14))

    report = deliver_all(deliverer)

    assert report.claimed == 0
    assert state_of(ledger, key_of(1)) is DeliveryState.RETRY_SCHEDULED


def test_transient_retry_is_sent_once_it_is_due(clock):
    ledger, mailer = frozen_ledger(1), FakeMailer(clock=clock)
    mailer.script(key_of(1), TRANSIENT)
    deliverer = make_deliverer(ledger, mailer, clock)
    deliver_all(deliverer)
    clock.advance(timedelta(seconds=15))

    deliver_all(deliverer)

    assert state_of(ledger, key_of(1)) is DeliveryState.SENT
    assert [a.outcome for a in ledger.attempts(key_of(1))] == ["transient", "sent"]
    assert mailer.deliveries_for(key_of(1)) == 1
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_transient_failures_until_max_attempts_dead_letter_after_exactly_that_many_calls(clock):
    policy = DeliveryPolicy(retry=RetryPolicy(max_attempts=3))
    ledger, mailer = frozen_ledger(1), FakeMailer(clock=clock)
    mailer.script(key_of(1), *[TRANSIENT] * 10)
    deliverer = make_deliverer(ledger, mailer, clock, policy=policy)

    for _ in range(6):
        deliver_all(deliverer)
        clock.advance(timedelta(minutes=5))

    assert state_of(ledger, key_of(1)) is DeliveryState.DEAD_LETTERED
    assert mailer.sends_for(key_of(1)) == 3
    [dead] = ledger.dead_letters(W42)
    assert (dead.reason, dead.attempts, dead.last_failure_class) == (
        "max_attempts",
        3,
        FailureClass.TRANSIENT,
    )
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_retry_that_would_land_past_max_age_dead_letters_the_item(clock):
    # The first retry would wait 15 s; the item may only be retried for 10 s.
    policy = DeliveryPolicy(retry=RetryPolicy(max_age=timedelta(seconds=10)))
    ledger, mailer = frozen_ledger(1), FakeMailer(clock=clock)
    mailer.script(key_of(1), TRANSIENT)

    deliver_all(make_deliverer(ledger, mailer, clock, policy=policy))

    assert state_of(ledger, key_of(1)) is DeliveryState.DEAD_LETTERED
    assert dead_letter_reasons(ledger) == {str(key_of(1)): "max_age"}
    assert mailer.sends_for(key_of(1)) == 1


def test_max_age_runs_from_the_first_attempt_not_the_latest(clock):
    # Retries land at +15 s and +45 s; the third would land at +105 s, past the 60 s max age.
    policy = DeliveryPolicy(retry=RetryPolicy(max_age=timedelta(seconds=60)))
    ledger, mailer = frozen_ledger(1), FakeMailer(clock=clock)
    mailer.script(key_of(1), *[TRANSIENT] * 5)
    deliverer = make_deliverer(ledger, mailer, clock, policy=policy)

    for _ in range(5):
        deliver_all(deliverer)
        item = ledger.get(key_of(1))
        assert item is not None
        if item.next_attempt_at is not None:
            clock.set(item.next_attempt_at)

    assert dead_letter_reasons(ledger) == {str(key_of(1)): "max_age"}
    assert mailer.sends_for(key_of(1)) == 3


# --- throttled --------------------------------------------------------------------------------


def test_throttled_failure_honours_retry_after_plus_jitter(clock):
    ledger, mailer = frozen_ledger(1), FakeMailer(clock=clock)
    mailer.script(key_of(1), throttled(timedelta(minutes=10)))

    deliver_all(make_deliverer(ledger, mailer, clock))

    item = ledger.get(key_of(1))
    assert item is not None
    # the provider's wait, plus base * draw (30 s * 0.5) so throttled items do not wake together
    assert (item.state, item.next_attempt_at) == (
        DeliveryState.RETRY_SCHEDULED,
        T0 + timedelta(minutes=10, seconds=15),
    )


def test_throttled_failure_without_retry_after_waits_the_backoff_bound_plus_jitter(clock):
    ledger, mailer = frozen_ledger(1), FakeMailer(clock=clock)
    mailer.script(key_of(1), throttled(None))

    deliver_all(make_deliverer(ledger, mailer, clock))

    item = ledger.get(key_of(1))
    assert item is not None
    assert item.next_attempt_at == T0 + timedelta(seconds=30 + 15)


def test_throttled_failure_gives_back_the_budget_unit(clock):
    ledger, mailer = frozen_ledger(1), FakeMailer(clock=clock)
    mailer.script(key_of(1), throttled(timedelta(minutes=1)))

    deliver_all(make_deliverer(ledger, mailer, clock))

    item = ledger.get(key_of(1))
    assert item is not None
    assert (item.budget_used, item.attempts) == (0, 1)


def test_throttling_never_exhausts_the_attempt_budget(clock):
    policy = DeliveryPolicy(retry=RetryPolicy(max_attempts=2))
    ledger, mailer = frozen_ledger(1), FakeMailer(clock=clock)
    mailer.script(key_of(1), *[throttled(timedelta(seconds=30))] * 4)
    deliverer = make_deliverer(ledger, mailer, clock, policy=policy)

    for _ in range(5):
        deliver_all(deliverer)
        clock.advance(timedelta(minutes=1))

    assert state_of(ledger, key_of(1)) is DeliveryState.SENT
    assert mailer.sends_for(key_of(1)) == 5
    assert ledger.dead_letters(W42) == []


# --- permanent --------------------------------------------------------------------------------


def test_permanent_failure_fails_the_item_with_a_permanent_dead_letter(clock):
    ledger, mailer = frozen_ledger(1), FakeMailer(clock=clock)
    mailer.script(key_of(1), PERMANENT)

    deliver_all(make_deliverer(ledger, mailer, clock))

    assert state_of(ledger, key_of(1)) is DeliveryState.FAILED
    assert dead_letter_reasons(ledger) == {str(key_of(1)): "permanent"}
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_render_error_fails_the_item_without_calling_the_mailer(clock):
    ledger, mailer, composer = frozen_ledger(1), FakeMailer(clock=clock), FakeComposer()
    composer.fail_for(key_of(1).customer_id)

    deliver_all(make_deliverer(ledger, mailer, clock, composer=composer))

    item = ledger.get(key_of(1))
    assert item is not None
    assert (item.state, item.last_detail) == (DeliveryState.FAILED, "render_error")
    assert dead_letter_reasons(ledger) == {str(key_of(1)): "permanent"}
    assert mailer.sends == 0


@pytest.mark.parametrize("cause", ["provider", "render"])
def test_failed_item_is_never_retried_by_later_runs(clock, cause):
    ledger, mailer, composer = frozen_ledger(1), FakeMailer(clock=clock), FakeComposer()
    if cause == "provider":
        mailer.script(key_of(1), PERMANENT)
    else:
        composer.fail_for(key_of(1).customer_id)
    deliverer = make_deliverer(ledger, mailer, clock, composer=composer)
    deliver_all(deliverer)
    sends_before = mailer.sends

    for _ in range(3):
        clock.advance(timedelta(hours=2))
        assert deliver_all(deliverer).claimed == 0

    assert state_of(ledger, key_of(1)) is DeliveryState.FAILED
    assert mailer.sends == sends_before


# --- unknown ----------------------------------------------------------------------------------


def test_timeout_after_accept_is_unknown_never_retry_scheduled(clock):
    ledger, mailer = frozen_ledger(1), FakeMailer(clock=clock)
    mailer.script_timeout_after_accept(key_of(1))

    deliver_all(make_deliverer(ledger, mailer, clock))

    item = ledger.get(key_of(1))
    assert item is not None
    assert (item.state, item.next_attempt_at, item.last_failure_class) == (
        DeliveryState.UNKNOWN,
        None,
        FailureClass.UNKNOWN,
    )
    assert mailer.deliveries_for(key_of(1)) == 1  # the provider did deliver it
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_unknown_item_is_not_resent_by_later_delivery_runs(clock):
    ledger, mailer = frozen_ledger(1), FakeMailer(clock=clock)
    mailer.script_timeout_after_accept(key_of(1))
    deliverer = make_deliverer(ledger, mailer, clock)
    deliver_all(deliverer)

    for _ in range(3):
        clock.advance(timedelta(hours=1))
        deliver_all(deliverer)

    assert state_of(ledger, key_of(1)) is DeliveryState.UNKNOWN
    assert mailer.sends_for(key_of(1)) == 1


def test_mailer_raising_an_ordinary_exception_is_unknown_not_retried_blindly(clock):
    ledger, mailer = frozen_ledger(1), RaisingMailer()
    deliverer = make_deliverer(ledger, mailer, clock)

    deliver_all(deliverer)
    clock.advance(timedelta(hours=1))
    deliver_all(deliverer)

    item = ledger.get(key_of(1))
    assert item is not None
    assert (item.state, item.last_detail) == (
        DeliveryState.UNKNOWN,
        "mailer_raised:ConnectionResetError",
    )
    assert mailer.calls == 1
    assert [a.outcome for a in ledger.attempts(key_of(1))] == ["unknown"]
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_composer_bug_fails_only_that_item_and_the_run_goes_on(clock):
    ledger, mailer = frozen_ledger(3), FakeMailer(clock=clock)
    composer = BrokenComposer(key_of(1).customer_id)

    deliver_all(make_deliverer(ledger, mailer, clock, composer=composer), batch_size=1)

    assert (state_of(ledger, key_of(1)), mailer.sends_for(key_of(1))) == (DeliveryState.FAILED, 0)
    assert [a.finished_at for a in ledger.attempts(key_of(1))] == [clock.now()]
    assert ledger.state_counts(W42) == {DeliveryState.FAILED: 1, DeliveryState.SENT: 2}


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


# --- waves ------------------------------------------------------------------------------------


@pytest.mark.parametrize("remote", [True, False])
@pytest.mark.parametrize("concurrency", [1, 2, 3, 8, 16, 17, 64, 256])
def test_waves_in_flight_never_hold_more_than_concurrency_attempts(concurrency, remote):
    size, depth = wave_shape(concurrency, remote)
    assert size >= 1
    assert depth >= 1
    assert size * depth <= concurrency


class MostAtSendMailer(FakeMailer):
    """Records, at every send, the most a ledger count ever was (`most`).

    The count must be one atomic snapshot of the ledger (one lock hold): counted key by key,
    the deliverer's threads could record a wave and start the next during the walk, and the sum
    would exceed what was ever there at once.
    """

    def __init__(
        self, clock: FixedClock, count: Callable[[], int], remote: bool | None = None
    ) -> None:
        super().__init__(clock=clock, remote=remote)
        self._count = count
        self._lock_most = threading.Lock()
        self.most = 0

    def send(self, message: Message, *, idempotency_key: str) -> SendOutcome:
        now = self._count()
        with self._lock_most:
            self.most = max(self.most, now)
        return super().send(message, idempotency_key=idempotency_key)


@pytest.mark.parametrize("remote", [True, False])
@pytest.mark.parametrize("concurrency", [1, 4, 16])
def test_a_worker_never_has_more_than_concurrency_attempts_open(clock, concurrency, remote):
    ledger = frozen_ledger(60)
    mailer = MostAtSendMailer(clock, lambda: ledger.open_attempt_count("w1"), remote)

    report = deliver_due(
        make_deliverer(ledger, mailer, clock, owner="w1"),
        batch_size=25,
        concurrency=concurrency,
    )

    assert report.outcomes == {"sent": 60}
    assert 1 <= mailer.most <= concurrency
    assert all(mailer.deliveries_for(key_of(n)) == 1 for n in range(1, 61))


@pytest.mark.parametrize("claim", [8, 24, 64])
def test_a_crash_would_strand_at_most_one_claim_and_the_waves_queued_when_it_was_taken(
    clock, claim
):
    # A run over a database server takes the next claim on its claim thread once no more than
    # AHEAD_WAVES waves are queued: at any send, the leases without an attempt are at most that
    # claim, those waves and the wave composed ahead, never two claims (24 and 64 are more than
    # the waves, so a second claim taken ahead would break the bound).
    ledger = frozen_ledger(150)
    # what a crash of the worker would leave leased until the leases run out
    mailer = MostAtSendMailer(clock, lambda: ledger.leased_unattempted_count("w1"))
    concurrency = 4
    size, _ = wave_shape(concurrency, mailer.capabilities.remote)

    report = deliver_due(
        make_deliverer(ledger, mailer, clock, owner="w1"),
        batch_size=claim,
        concurrency=concurrency,
    )

    assert report.outcomes == {"sent": 150}
    assert all(mailer.deliveries_for(key_of(n)) == 1 for n in range(1, 151))
    assert 0 < mailer.most <= claim + (AHEAD_WAVES + 1) * size


class StartedAtComposeComposer(FakeComposer):
    """Records, at every compose, how many attempts the ledger holds (started, open or not)."""

    def __init__(self, count: Callable[[], int]) -> None:
        super().__init__()
        self._count = count
        self.seen: list[int] = []

    def compose(self, item, recipient, rows):
        self.seen.append(self._count())  # only the worker's own thread composes
        return super().compose(item, recipient, rows)


@pytest.mark.parametrize("concurrency", [4, 16, 64])
def test_each_wave_to_a_provider_starts_before_the_next_is_composed(clock, concurrency):
    # Waves composed together would start, end and be recorded together, the provider's slots
    # idle while the next ones are composed: each wave's attempts are recorded, and its sends
    # handed to the pool, before the next wave's first message is composed.
    ledger = frozen_ledger(200)
    mailer = FakeMailer(clock=clock, remote=True)
    composer = StartedAtComposeComposer(lambda: ledger.attempt_count("w1"))
    size, depth = wave_shape(concurrency, remote=True)
    assert depth > 1  # several waves in flight: what could be composed together

    report = deliver_due(
        make_deliverer(ledger, mailer, clock, owner="w1", composer=composer),
        batch_size=200,
        concurrency=concurrency,
    )

    assert report.outcomes == {"sent": 200}
    assert len(composer.seen) == 200
    # the k-th message (from 0) is in wave k // size: every wave before it is started
    assert all(started >= (k // size) * size for k, started in enumerate(composer.seen))


class ClockJumpingComposer(FakeComposer):
    """Moves the clock to `to` while composing its `nth` message (a slow wave, compressed)."""

    def __init__(self, clock: FixedClock, nth: int, to) -> None:
        super().__init__()
        self._clock, self._nth, self._to, self._count = clock, nth, to, 0

    def compose(self, item, recipient, rows):
        self._count += 1  # only the worker's own thread composes
        if self._count == self._nth:
            self._clock.set(self._to)
        return super().compose(item, recipient, rows)


def test_a_wave_composed_ahead_never_starts_after_the_window_closed(clock):
    # At concurrency 64 the fifth wave is composed while four are sending. Here the week's
    # delivery window closes while it waits: it must be prepared again (and dead-lettered),
    # never started late because it passed the window check before the close.
    policy = DeliveryPolicy()
    closes_at = W42.ends_at + policy.delivery_window
    clock.set(closes_at - timedelta(minutes=1))
    ledger, mailer = frozen_ledger(200), FakeMailer(clock=clock)
    composer = ClockJumpingComposer(clock, nth=70, to=closes_at + timedelta(seconds=1))

    report = deliver_due(
        make_deliverer(ledger, mailer, clock, policy=policy, composer=composer),
        batch_size=200,
        concurrency=64,
        breaker_threshold=0,
    )

    attempts = [a for n in range(1, 201) for a in ledger.attempts(key_of(n))]
    assert len(attempts) >= 64  # the four waves started before the close
    assert all(a.started_at < closes_at for a in attempts)
    assert len(attempts) == mailer.sends == report.outcomes["sent"]
    assert all(mailer.deliveries_for(key_of(n)) <= 1 for n in range(1, 201))
    late = [i for i in ledger.items(W42) if not i.attempts]
    assert len(late) == 200 - len(attempts)
    assert {i.state for i in late} == {DeliveryState.DEAD_LETTERED}
    assert {d.reason for d in ledger.dead_letters(W42)} == {"window_closed"}
