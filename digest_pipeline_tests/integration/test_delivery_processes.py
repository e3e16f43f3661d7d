"""Delivery helper processes (`DIGEST_DELIVERY_PROCESSES`) on PostgreSQL: every item once.

A helper is a forked process that works its share of a step's items on connections of its
own. The witnesses are the ledger (one claim and one attempt per item, every invariant
holding) and a mailer that appends each key it sends to a file of its own process, so a key
sent twice, by whichever processes, shows.
"""

import os
import signal
import threading
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import pytest
from sqlalchemy import func, select

from digest_pipeline.adapters.sql import ledger as sql_ledger
from digest_pipeline.adapters.sql.identity import ledger_id
from digest_pipeline.adapters.sql.ledger import SqlLedger, open_same_ledger
from digest_pipeline.adapters.sql.schema import attempts
from digest_pipeline.domain.errors import BreakerOpen, DeliveryHelperFailed, LedgerMismatch
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import MailerCapabilities, Message
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.ports import Clock, Ledger, Mailer
from digest_pipeline.rigs.seeding import T0
from digest_pipeline.runtime.helpers import (
    allow_forks_beside,
    between_forks,
    deliver_in_processes,
)
from digest_pipeline_tests.builders import make_deliverer, seed_period
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.fakes import PortableComposer
from digest_pipeline_tests.run_worker import run_worker_threads

pytestmark = pytest.mark.integration


class ShiftedClock(Clock):
    """Real time moved to the seeded week, the same in every process made from its recipe."""

    def __init__(self, start: datetime, real_start: datetime) -> None:
        self._start, self._real_start = start, real_start

    def now(self) -> datetime:
        return self._start + (datetime.now(UTC) - self._real_start)

    def recipe(self) -> Callable[[], Clock]:
        return partial(ShiftedClock, self._start, self._real_start)


class KeyLogMailer(Mailer):
    """Accepts every message and appends its key to `keys-<pid>.txt` in `folder`.

    `fail`: every send fails with that transient code instead. `kill_at`: a helper (any
    process but `parent`) kills itself with SIGKILL at its `kill_at`-th send, before it logs.
    """

    def __init__(
        self, folder: Path, parent: int, fail: str | None = None, kill_at: int | None = None
    ) -> None:
        self._args = (folder, parent, fail, kill_at)
        self._file = (folder / f"keys-{os.getpid()}.txt").open("a", encoding="utf-8")
        self._sends = 0

    @property
    def capabilities(self) -> MailerCapabilities:
        return MailerCapabilities(idempotency_window=None, can_lookup=False, remote=False)

    def send(self, message: Message, *, idempotency_key: str) -> SendOutcome:
        _, parent, fail, kill_at = self._args
        self._sends += 1
        if kill_at is not None and os.getpid() != parent and self._sends == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if fail is not None:
            return SendOutcome.failed(FailureClass.TRANSIENT, fail)
        self._file.write(idempotency_key + "\n")
        self._file.flush()
        return SendOutcome.sent(f"msg-{idempotency_key}")

    def close(self) -> None:
        self._file.close()

    def recipe(self) -> Callable[[], Mailer]:
        return partial(KeyLogMailer, *self._args)


def sent_keys(folder: Path) -> Counter[str]:
    """Every key any process sent, counted over all of their files."""
    return Counter(
        line for path in folder.glob("keys-*.txt") for line in path.read_text().splitlines()
    )


def attempts_by_worker(ledger: SqlLedger) -> dict[str, int]:
    with ledger.engine.connect() as conn:
        rows = conn.execute(select(attempts.c.worker, func.count()).group_by(attempts.c.worker))
        return {worker: n for worker, n in rows}


@pytest.fixture
def pg(sql_engine_factory) -> SqlLedger:
    ledger = SqlLedger(sql_engine_factory("postgres"))
    ledger_id(ledger.engine, T0)  # a run's ledger carries its id: a helper checks it
    return ledger


@pytest.fixture
def week_clock() -> ShiftedClock:
    return ShiftedClock(T0, datetime.now(UTC))


@pytest.mark.parametrize("processes", [2, 3])
def test_every_item_is_delivered_exactly_once(processes, pg, week_clock, tmp_path):
    keys = seed_period(pg, 3_000, now=T0, rows_per_customer=1)
    mailer = KeyLogMailer(tmp_path, os.getpid())
    deliverer = make_deliverer(pg, mailer, week_clock, composer=PortableComposer(), owner="step")
    report = deliver_in_processes(deliverer, processes, batch_size=256, concurrency=16, period=W42)
    mailer.close()
    assert report.claimed == 3_000
    assert report.outcomes == {DeliveryState.SENT: 3_000}
    assert sent_keys(tmp_path) == Counter({str(k): 1 for k in keys})
    # every process really took part: each recorded attempts under its own owner
    workers = attempts_by_worker(pg)
    assert set(workers) == {"step", *(f"step/p{n}" for n in range(1, processes))}
    assert min(workers.values()) > 0
    final = pg.items(W42)
    assert {(i.state, i.lease_token, i.attempts) for i in final} == {(DeliveryState.SENT, 1, 1)}
    assert all(r.passed for r in pg.check_invariants(W42, week_clock.now()))


def test_helpers_fork_beside_a_run_workers_threads_and_deliver_once(pg, week_clock, tmp_path):
    # a UI launch (run worker) or a multiprocess or Celery step process, as far as threads go
    keys = seed_period(pg, 2_000, now=T0, rows_per_customer=1)
    mailer = KeyLogMailer(tmp_path, os.getpid())
    deliverer = make_deliverer(pg, mailer, week_clock, composer=PortableComposer(), owner="step")
    with run_worker_threads():
        report = deliver_in_processes(deliverer, 2, batch_size=256, concurrency=16, period=W42)
    mailer.close()
    assert report.outcomes == {DeliveryState.SENT: 2_000}
    assert sent_keys(tmp_path) == Counter({str(k): 1 for k in keys})
    assert set(attempts_by_worker(pg)) == {"step", "step/p1"}
    assert all(r.passed for r in pg.check_invariants(W42, week_clock.now()))


def test_helpers_fork_beside_a_progress_line_reading_the_same_ledger(pg, week_clock, tmp_path):
    # `digest run`'s progress line on a terminal: the step's own ledger, read all the time
    keys = seed_period(pg, 2_000, now=T0, rows_per_customer=1)
    stop = threading.Event()
    reads: list[int] = []

    def draw() -> None:
        while not stop.is_set():
            with between_forks():
                reads.append(sum(pg.state_counts(W42).values()))

    progress = threading.Thread(target=draw, daemon=True)
    allow_forks_beside(progress)
    progress.start()
    mailer = KeyLogMailer(tmp_path, os.getpid())
    deliverer = make_deliverer(pg, mailer, week_clock, composer=PortableComposer(), owner="step")
    try:
        report = deliver_in_processes(deliverer, 3, batch_size=128, concurrency=8, period=W42)
    finally:
        stop.set()
        progress.join()
    mailer.close()
    assert reads, "the progress line never read the ledger"
    assert report.outcomes == {DeliveryState.SENT: 2_000}
    assert sent_keys(tmp_path) == Counter({str(k): 1 for k in keys})
    assert set(attempts_by_worker(pg)) == {"step", "step/p1", "step/p2"}
    assert all(r.passed for r in pg.check_invariants(W42, week_clock.now()))


def test_the_bound_is_shared_out_and_never_exceeded(pg, week_clock, tmp_path):
    seed_period(pg, 1_500, now=T0, rows_per_customer=1)
    mailer = KeyLogMailer(tmp_path, os.getpid())
    deliverer = make_deliverer(pg, mailer, week_clock, composer=PortableComposer(), owner="step")
    report = deliver_in_processes(
        deliverer, 2, batch_size=128, concurrency=8, period=W42, max_items=1_001
    )
    mailer.close()
    assert report.claimed == 1_001
    assert attempts_by_worker(pg) == {"step": 501, "step/p1": 500}
    assert sum(sent_keys(tmp_path).values()) == 1_001
    states = Counter(i.state for i in pg.items(W42))
    assert states == {DeliveryState.SENT: 1_001, DeliveryState.PENDING: 499}


def test_a_killed_helper_fails_the_step_and_sends_nothing_twice(pg, week_clock, tmp_path):
    seed_period(pg, 2_000, now=T0, rows_per_customer=1)
    mailer = KeyLogMailer(tmp_path, os.getpid(), kill_at=100)
    deliverer = make_deliverer(pg, mailer, week_clock, composer=PortableComposer(), owner="step")
    with pytest.raises(DeliveryHelperFailed, match=r"step/p1 ended \(signal 9\) without"):
        deliver_in_processes(deliverer, 2, batch_size=256, concurrency=16, period=W42)
    mailer.close()
    sent = sent_keys(tmp_path)
    assert max(sent.values()) == 1
    items = {str(i.key): i for i in pg.items(W42)}
    by_state = {s: {k for k, i in items.items() if i.state == s} for s in DeliveryState}
    # every recorded send reached the mailer once; a send whose outcome the helper did not
    # live to record is a claimed item with an open attempt (reconciled once its lease runs
    # out), never an item that looks unsent
    assert by_state[DeliveryState.SENT] <= set(sent)
    assert set(sent) <= by_state[DeliveryState.SENT] | by_state[DeliveryState.CLAIMED]
    # the helper's held claims stay leased to it until their leases run out: never lost,
    # never handed to another worker before then
    held = [items[k] for k in by_state[DeliveryState.CLAIMED]]
    assert held
    assert {i.lease_owner for i in held} == {"step/p1"}
    assert all(r.passed for r in pg.check_invariants(W42, week_clock.now()))


def test_an_open_breaker_in_every_process_stops_the_step(pg, week_clock, tmp_path):
    seed_period(pg, 2_000, now=T0, rows_per_customer=1)
    mailer = KeyLogMailer(tmp_path, os.getpid(), fail="provider_down")
    deliverer = make_deliverer(pg, mailer, week_clock, composer=PortableComposer(), owner="step")
    with pytest.raises(BreakerOpen):
        deliver_in_processes(
            deliverer, 2, batch_size=256, concurrency=4, period=W42, breaker_threshold=5
        )
    mailer.close()
    assert sent_keys(tmp_path) == Counter()
    # each process stopped at its own breaker: far fewer attempts than items
    assert 0 < sum(attempts_by_worker(pg).values()) < 200
    assert all(r.passed for r in pg.check_invariants(W42, week_clock.now()))


def test_a_helper_refuses_a_ledger_that_is_not_the_runs(pg, week_clock, tmp_path, monkeypatch):
    keys = seed_period(pg, 500, now=T0, rows_per_customer=1)
    url = pg.engine.url.render_as_string(hide_password=False)

    def elsewhere(self: SqlLedger) -> Callable[[], Ledger]:
        return partial(open_same_ledger, url, "another-ledger")

    monkeypatch.setattr(sql_ledger.SqlLedger, "recipe", elsewhere)
    mailer = KeyLogMailer(tmp_path, os.getpid())
    deliverer = make_deliverer(pg, mailer, week_clock, composer=PortableComposer(), owner="step")
    with pytest.raises(DeliveryHelperFailed, match=r"LedgerMismatch: .* is not the run's"):
        deliver_in_processes(deliverer, 2, batch_size=64, concurrency=4, period=W42)
    mailer.close()
    # the helper touched nothing; what the step's own process claimed (it stops claiming once
    # it sees the helper failed) it delivered once, and the rest is still due
    assert set(attempts_by_worker(pg)) == {"step"}
    sent = sent_keys(tmp_path)
    assert sent
    assert max(sent.values()) == 1
    states = {str(i.key): i.state for i in pg.items(W42)}
    assert set(states) == {str(k) for k in keys}
    assert {k for k, s in states.items() if s == DeliveryState.SENT} == set(sent)
    assert set(states.values()) <= {DeliveryState.SENT, DeliveryState.PENDING}


def test_open_same_ledger_opens_only_the_ledger_it_was_given(pg):
    url = pg.engine.url.render_as_string(hide_password=False)
    recipe = pg.recipe()
    assert recipe is not None
    same = recipe()
    assert isinstance(same, SqlLedger)
    assert same is not pg
    same.engine.dispose()
    with pytest.raises(LedgerMismatch, match="is not the run's"):
        open_same_ledger(url, "another-ledger")
