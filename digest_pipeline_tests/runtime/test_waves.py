"""The wave engine: never more than `concurrency` attempts open, each wave started before the next is composed.

Assertions are about what the mailer saw in flight and what is recorded.
"""

import threading
from collections.abc import Callable
from datetime import timedelta

import pytest

from digest_pipeline.domain.failures import SendOutcome
from digest_pipeline.domain.model import (
    Message,
)
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.domain.waves import AHEAD_WAVES, wave_shape
from digest_pipeline.services.deliver import deliver_due
from digest_pipeline_tests.builders import (
    frozen_ledger,
    key_of,
    make_deliverer,
)
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.fakes import FakeComposer, FakeMailer, FixedClock

# every test here on both delivery loops: a provider's pool and a local mailer's ledger thread
pytestmark = pytest.mark.usefixtures("both_mailer_kinds")


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
