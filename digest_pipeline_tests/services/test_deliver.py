"""The delivery gate over the fakes: each failure class leads to the state design §2 names.

Assertions are about what is recorded (states, schedules, dead letters, invariants) and what the
simulated provider actually delivered, not about how often a method was called.
"""

from collections.abc import Sequence
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
from digest_pipeline.ports import Mailer
from digest_pipeline_tests.builders import (
    deliver_all,
    email_of,
    failed_invariants,
    frozen_ledger,
    key_of,
    make_deliverer,
    state_of,
)
from digest_pipeline_tests.conftest import T0, W42
from digest_pipeline_tests.fakes import FakeComposer, FakeMailer
from digest_pipeline_tests.outcomes import PERMANENT, TRANSIENT, dead_letter_reasons, throttled

# every test here on both delivery loops: a provider's pool and a local mailer's ledger thread
pytestmark = pytest.mark.usefixtures("both_mailer_kinds")


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
