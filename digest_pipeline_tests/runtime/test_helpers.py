"""`deliver_in_processes` where no helper can be forked, and the recipes helpers are made from.

A helper needs every port as a recipe another process can follow; without one (a test's
clock, a ledger in this process) the step delivers alone and says why in one line. The recipes
the adapters give must make equal ports: the same outbox, the same composer.
"""

import logging
import ssl
import threading
from collections.abc import Callable
from datetime import timedelta
from functools import partial

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from digest_pipeline.adapters.clock import SystemClock
from digest_pipeline.adapters.forkable import recipe_of
from digest_pipeline.adapters.mail.http import HttpProviderMailer
from digest_pipeline.adapters.mail.mime import to_bytes
from digest_pipeline.adapters.mail.outbox import OutboxMailer
from digest_pipeline.adapters.mail.render import Jinja2Composer
from digest_pipeline.adapters.mail.smtp import SmtpMailer
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.domain.model import DigestRow, Message, WorkItem
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.ports import Clock
from digest_pipeline.runtime.helpers import (
    PARKED_THREADS,
    allow_forks_beside,
    between_forks,
    deliver_in_processes,
    running_threads,
    shares,
)
from digest_pipeline.settings import ProviderSettings, SmtpSettings
from digest_pipeline_tests.builders import make_deliverer, seed_period
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.fakes import FakeLedger, FakeMailer, FixedClock, PortableComposer
from digest_pipeline_tests.run_worker import run_worker_threads


@given(st.integers(0, 10**6), st.integers(1, 64))
def test_shares_add_up_to_the_bound_and_differ_by_one_at_most(total, processes):
    parts = [p for p in shares(total, processes) if p is not None]
    assert len(parts) == processes
    assert sum(parts) == total
    assert max(parts) - min(parts) <= 1


def test_no_bound_is_no_bound_for_any_process():
    assert shares(None, 3) == [None, None, None]


def test_fewer_than_one_process_is_refused(clock):
    deliverer = make_deliverer(FakeLedger(), FakeMailer(clock=clock), clock)
    with pytest.raises(ValueError, match="at least 1"):
        deliver_in_processes(deliverer, 0, batch_size=10, concurrency=1)


class _PortableClock(FixedClock):
    """A fixed clock another process could make: only the ledger lacks a recipe then."""

    def recipe(self) -> Callable[[], Clock]:
        return partial(_PortableClock, self.now())


def test_without_recipes_the_step_delivers_alone_and_says_why(clock, caplog):
    ledger = FakeLedger()
    keys = seed_period(ledger, 40, now=clock.now(), rows_per_customer=1)
    mailer = FakeMailer(clock=clock)
    deliverer = make_deliverer(ledger, mailer, clock)
    with caplog.at_level(logging.INFO, logger="digest_pipeline"):
        report = deliver_in_processes(deliverer, 2, batch_size=10, concurrency=2, period=W42)
    assert report.claimed == 40
    assert report.outcomes == {DeliveryState.SENT: 40}
    assert all(mailer.deliveries_for(k) == 1 for k in keys)
    # the fakes and the test's clock have no recipe: another process could not follow them
    assert _why(caplog) == [
        "event=delivery_processes asked=2 used=1 why=no_recipe:ledger,mailer,composer,clock"
    ]


def test_an_sqlite_ledger_is_delivered_by_one_process(sql_engine_factory, clock, caplog, tmp_path):
    ledger = SqlLedger(sql_engine_factory("sqlite"))
    seed_period(ledger, 30, now=clock.now(), rows_per_customer=1)
    mailer = OutboxMailer(tmp_path / "outbox")
    at = _PortableClock(clock.now())
    deliverer = make_deliverer(ledger, mailer, at, composer=PortableComposer())
    with caplog.at_level(logging.INFO, logger="digest_pipeline"):
        report = deliver_in_processes(deliverer, 2, batch_size=10, concurrency=2, period=W42)
    assert report.outcomes == {DeliveryState.SENT: 30}
    # every other port could be made again; SQLite's writers would only wait for each other
    assert _why(caplog) == ["event=delivery_processes asked=2 used=1 why=no_recipe:ledger"]


def test_a_thread_beside_the_step_keeps_it_in_one_process_and_is_named(clock, caplog):
    ledger = FakeLedger()
    seed_period(ledger, 20, now=clock.now(), rows_per_customer=1)
    deliverer = make_deliverer(ledger, FakeMailer(clock=clock), clock)
    release = threading.Event()
    poller = threading.Thread(target=release.wait, name="poller", daemon=True)
    poller.start()
    try:
        with caplog.at_level(logging.INFO, logger="digest_pipeline"):
            report = deliver_in_processes(deliverer, 2, batch_size=10, concurrency=2, period=W42)
    finally:
        release.set()
        poller.join()
    assert report.outcomes == {DeliveryState.SENT: 20}
    # checked before the recipes: whatever else is missing, a fork is already ruled out
    [line] = _why(caplog)
    assert line.startswith("event=delivery_processes asked=2 used=1 why=threads_running:")
    assert "poller" in line.split("why=threads_running:")[1].split(",")


def test_dagsters_parked_threads_do_not_keep_the_step_in_one_process():
    baseline = running_threads()  # a test runner may keep threads of its own
    with run_worker_threads() as started:
        assert started == PARKED_THREADS
        assert running_threads() == baseline
    # a thread of another kind with one of their names still counts
    release = threading.Event()
    lookalike = threading.Thread(target=release.wait, name="termination-handler")
    lookalike.start()
    try:
        assert running_threads() == sorted([*baseline, "termination-handler"])
    finally:
        release.set()
        lookalike.join()


def test_a_thread_that_works_only_between_forks_does_not_count():
    baseline = running_threads()
    release = threading.Event()

    def work() -> None:
        while not release.wait(0.01):
            with between_forks():
                pass

    marked = threading.Thread(target=work, name="progress")
    allow_forks_beside(marked)
    twin = threading.Thread(target=release.wait, name="progress")
    marked.start()
    twin.start()
    try:
        # only the unmarked one of the two
        assert running_threads() == sorted([*baseline, "progress"])
    finally:
        release.set()
        marked.join()
        twin.join()


def _why(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "delivery_processes" in r.getMessage()]


def test_one_process_asked_is_plain_delivery_without_a_line(clock, caplog):
    ledger = FakeLedger()
    seed_period(ledger, 5, now=clock.now(), rows_per_customer=1)
    deliverer = make_deliverer(ledger, FakeMailer(clock=clock), clock)
    with caplog.at_level(logging.INFO, logger="digest_pipeline"):
        report = deliver_in_processes(deliverer, 1, batch_size=10, concurrency=1, period=W42)
    assert report.claimed == 5
    assert _why(caplog) == []


def test_the_outbox_recipe_opens_the_same_outbox(tmp_path):
    recipe = OutboxMailer(tmp_path / "outbox").recipe()
    made = recipe()
    assert isinstance(made, OutboxMailer)
    assert made._dir == tmp_path / "outbox"


def test_mailers_built_around_a_test_object_have_no_recipe():
    smtp = SmtpSettings("127.0.0.1", 25, None, None, "none", 5.0)
    assert SmtpMailer(smtp).recipe() is not None
    assert SmtpMailer(smtp, ssl_context=ssl.create_default_context()).recipe() is None
    provider = ProviderSettings("https://provider.example/send", "k", 5.0, timedelta(hours=24))
    assert HttpProviderMailer(provider).recipe() is not None
    transport = httpx.MockTransport(lambda request: httpx.Response(200))
    assert HttpProviderMailer(provider, transport=transport).recipe() is None


def _composer(clock: object) -> Jinja2Composer:
    return Jinja2Composer(
        sender="Shop <digest@shop.example>",
        unsubscribe_url="https://shop.example/u/{customer_id}?token={token}",
        unsubscribe_secret="a-secret-of-some-length",
        clock=clock,  # type: ignore[arg-type]
        shop_name="Shop",
    )


def _without_date(message: Message) -> list[bytes]:
    # the Date header is the second the message was composed in
    return [line for line in to_bytes(message).split(b"\n") if not line.startswith(b"Date:")]


def test_the_composer_recipe_makes_a_composer_of_the_same_messages(clock):
    assert _composer(clock).recipe() is None  # a test's clock: only this process moves it
    original = _composer(SystemClock())
    recipe = original.recipe()
    assert recipe is not None
    made = recipe()
    key = OperationKey(W42, "customer-7")
    item = WorkItem(key, DeliveryState.CLAIMED, created_at=clock.now(), next_attempt_at=None)
    rows = [
        DigestRow(
            key,
            0,
            {
                "title": "Lamp",
                "price": "9.50",
                "currency": "EUR",
                "url": "https://shop.example/p/1",
            },
        )
    ]
    a = original.compose(item, "ada@example.com", rows)
    b = made.compose(item, "ada@example.com", rows)
    assert _without_date(a) == _without_date(b)


def test_an_sqlite_ledger_has_no_recipe(sql_engine_factory):
    assert SqlLedger(sql_engine_factory("sqlite")).recipe() is None


def test_the_system_clock_recipe_is_a_system_clock():
    assert isinstance(SystemClock().recipe()(), SystemClock)


def test_a_tests_clock_has_no_recipe(clock):
    assert recipe_of(clock) is None
