"""The install's pace and pause hold across every sender that shares a ledger.

Each sender takes its slot from the ledger's `send_pacing` row, so two workers (two processes,
in production) never send closer together than the rate allows; a provider's Retry-After pauses
every sender, and a spent quota pauses the week: items stay due, nobody is `failed`.
"""

import itertools
import multiprocessing
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
from sqlalchemy import Engine

from digest_pipeline.adapters.sql.engine import create_ledger_engine
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.adapters.sql.pacing import SqlSendBudget
from digest_pipeline.domain.errors import SendingPaused
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import Message
from digest_pipeline.domain.pacing import QUOTA_PAUSE, SLACK, Pause, Slot, slot_interval
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.runtime.pacing import Pacer
from digest_pipeline.services.deliver import Deliverer, deliver_due
from digest_pipeline_tests.builders import deliver_all, key_of, make_deliverer, seed_period
from digest_pipeline_tests.conftest import SQL_BACKENDS, T0, W42
from digest_pipeline_tests.fakes import FakeMailer, FixedClock

RATE = 4.0
QUOTA = "http:429:daily_quota_exceeded"


def _paced(deliverer: Deliverer, clock: FixedClock) -> Deliverer:
    """The deliverer's waits advance the test's clock instead of the wall clock."""
    assert isinstance(deliverer.pacer, Pacer)

    def wait(seconds: float) -> None:
        clock.advance(timedelta(seconds=seconds))

    deliverer.pacer.sleep = wait
    return deliverer


def _busiest_second(times: list[datetime]) -> int:
    """The most sends in any one-second window [t, t + 1 s) that starts at a send."""
    times = sorted(times)
    return max(
        (sum(1 for u in times if t <= u < t + timedelta(seconds=1)) for t in times), default=0
    )


def _send_times(mailer: FakeMailer) -> list[datetime]:
    with mailer._lock:
        return [d.at for d in mailer._deliveries if d.at is not None]


class QuotaMailer(FakeMailer):
    """A provider whose account quota can be spent: then every send is refused, nothing stored."""

    spent = False

    def send(self, message: Message, *, idempotency_key: str) -> SendOutcome:
        if self.spent:
            return SendOutcome.failed(FailureClass.THROTTLED, QUOTA, quota=True)
        return super().send(message, idempotency_key=idempotency_key)


def test_two_workers_sharing_a_ledger_never_exceed_the_rate_together(sql_ledger: SqlLedger):
    clock = FixedClock(T0)
    seed_period(sql_ledger, 16, now=clock.now())
    provider = FakeMailer(clock=clock)
    policy = DeliveryPolicy(send_rate=RATE)
    first = _paced(make_deliverer(sql_ledger, provider, clock, policy=policy, owner="a"), clock)
    second = _paced(make_deliverer(sql_ledger, provider, clock, policy=policy, owner="b"), clock)

    deliver_due(first, batch_size=4, concurrency=1, max_items=8)
    deliver_due(second, batch_size=4, concurrency=1)

    times = _send_times(provider)
    assert len(times) == 16
    assert provider.duplicate_deliveries == 0
    assert _busiest_second(times) <= RATE
    # any run of k sends spans at least k intervals less the slack, spent once
    times = sorted(times)
    interval = slot_interval(RATE)
    assert all(
        times[j] - times[i] >= (j - i) * interval - SLACK - timedelta(microseconds=1)
        for i in range(len(times))
        for j in range(i + 1, len(times))
    )


def test_a_retry_after_pauses_every_sender_until_it_ends(sql_ledger: SqlLedger):
    clock = FixedClock(T0)
    seed_period(sql_ledger, 6, now=clock.now())
    provider = FakeMailer(clock=clock)
    wait = timedelta(seconds=10)
    provider.script(
        key_of(1), SendOutcome.failed(FailureClass.THROTTLED, "http:429", retry_after=wait)
    )
    throttled_at = clock.now()
    deliver_all(_paced(make_deliverer(sql_ledger, provider, clock, owner="a"), clock))
    # another worker, started afterwards, learns of the pause from the ledger
    other = _paced(make_deliverer(sql_ledger, provider, clock, owner="b"), clock)
    assert isinstance(other.pacer, Pacer)
    assert other.pacer.pause_in_force(throttled_at) == Pause(throttled_at + wait, "http:429")

    sent = _send_times(provider)
    assert len(sent) == 5  # customer 1 waits for its own retry time
    assert all(t >= throttled_at + wait for t in sent)


def test_a_spent_quota_pauses_the_week_and_fails_nobody(sql_ledger: SqlLedger):
    clock = FixedClock(T0)
    seed_period(sql_ledger, 8, now=clock.now())
    provider = QuotaMailer(clock=clock)
    provider.spent = True

    with pytest.raises(SendingPaused, match=QUOTA):
        deliver_all(make_deliverer(sql_ledger, provider, clock, owner="a"))
    items = sql_ledger.items(W42)
    attempted = {i.key for i in items if i.attempts}
    assert {i.state for i in items} <= {DeliveryState.PENDING, DeliveryState.RETRY_SCHEDULED}
    assert all(
        i.next_attempt_at is not None and i.next_attempt_at >= T0 + QUOTA_PAUSE
        for i in items
        if i.key in attempted
    )

    # a later sweep within the pause claims nothing and asks the provider nothing
    clock.advance(timedelta(minutes=10))
    with pytest.raises(SendingPaused, match=QUOTA):
        deliver_all(make_deliverer(sql_ledger, provider, clock, owner="b"))
    assert {i.key for i in sql_ledger.items(W42) if i.attempts} == attempted
    assert all(sql_ledger.attempts(k)[-1].outcome == "throttled" for k in attempted)

    # once the quota resets and the pause and retry times pass, each digest goes out once
    provider.spent = False
    clock.advance(QUOTA_PAUSE + DeliveryPolicy().retry.base)
    deliver_all(make_deliverer(sql_ledger, provider, clock, owner="c"))
    assert {i.state for i in sql_ledger.items(W42)} == {DeliveryState.SENT}
    assert all(provider.deliveries_for(key_of(n)) == 1 for n in range(1, 9))


def test_a_pause_only_lengthens_and_holds_every_slot_until_it_ends(sql_ledger: SqlLedger):
    budget = SqlSendBudget(sql_ledger._engine)
    step = timedelta(seconds=1)
    assert budget.take_slot("http:x", step, T0) == Slot(False, T0)  # makes the row
    # a first slot starts the schedule from now
    assert budget.take_slot("http:x", step, T0) == Slot(True, T0 + step)
    budget.pause("http:x", Pause(T0 + timedelta(hours=1), "quota"))
    budget.pause("http:x", Pause(T0 + timedelta(seconds=5), "http:429"))
    quota = Pause(T0 + timedelta(hours=1), "quota")
    assert budget.current_pause("http:x") == quota

    later = T0 + timedelta(minutes=5)
    assert budget.take_slot("http:x", step, later) == Slot(False, quota.until, quota)
    after = T0 + timedelta(hours=2)
    assert budget.take_slot("http:x", step, after) == Slot(True, after + step)
    # another mailer's budget is its own
    budget.take_slot("smtp:y", step, T0)
    assert budget.take_slot("smtp:y", step, T0).taken


def test_a_late_take_keeps_the_schedule_within_the_slack_and_restarts_it_beyond(
    sql_ledger: SqlLedger,
):
    budget = SqlSendBudget(sql_ledger._engine)
    step = timedelta(seconds=1)
    budget.take_slot("http:x", step, T0)
    first = budget.take_slot("http:x", step, T0).free_at
    assert first == T0 + step
    # too early: not taken, and told when
    assert budget.take_slot("http:x", step, first - step / 2) == Slot(False, first)
    # a little late: the next slot stays on the schedule
    assert budget.take_slot("http:x", step, first + SLACK / 2).free_at == first + step
    # much later: a new schedule starts from now, never crowding the next send
    late = first + 10 * step
    assert budget.take_slot("http:x", step, late).free_at == late + step


def _take_slots(url: str, count: int, out: "multiprocessing.Queue[list[float]]") -> None:
    engine = create_ledger_engine(url, create=False)
    budget = SqlSendBudget(engine)
    step = timedelta(milliseconds=2)
    got: list[float] = []
    while len(got) < count:
        now = datetime.now(T0.tzinfo)
        if budget.take_slot("http:shared", step, now).taken:
            got.append(now.timestamp())
    engine.dispose()
    out.put(got)


@pytest.mark.parametrize("backend", SQL_BACKENDS)
def test_slots_taken_by_concurrent_processes_are_distinct_and_spaced(
    sql_engine_factory: Callable[[str], Engine], backend: str
):
    engine = sql_engine_factory(backend)
    url = engine.url.render_as_string(hide_password=False)
    spawn = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue[list[float]] = spawn.Queue()
    workers = [spawn.Process(target=_take_slots, args=(url, 60, out)) for _ in range(3)]
    for w in workers:
        w.start()
    slots = sorted(s for _ in workers for s in out.get(timeout=120))
    for w in workers:
        w.join(timeout=60)
    # every take is at least an interval less the slack after the one before, whichever
    # process made it; over any run of takes the slack is spent once, not per take
    assert len(slots) == 180
    gaps = [b - a for a, b in itertools.pairwise(slots)]
    assert min(gaps) >= 0.002 - SLACK.total_seconds()
    assert all(
        slots[j] - slots[i] >= (j - i) * 0.002 - SLACK.total_seconds() - 1e-6
        for i in range(len(slots))
        for j in range(i + 1, min(i + 40, len(slots)))
    )
