"""Concurrent workers on one SQL ledger: every item claimed, sent and cleaned exactly once.

On PostgreSQL the claims race through `FOR UPDATE SKIP LOCKED`; on SQLite through serialized
`BEGIN IMMEDIATE` transactions. Evidence comes from the ledger (one attempt and fencing token 1
per item) and from the provider's own record (one delivery per key). Transactions that lock
many items at once (cleanup, content regeneration) lock them in one order whatever their plans,
so two of them never deadlock.
"""

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine, event, func, select, text

from digest_pipeline.adapters.sql.engine import create_ledger_engine
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.adapters.sql.schema import (
    cleanups,
    digest_rows,
    digest_rows_archive,
    work_items,
)
from digest_pipeline.domain.model import CleanupMode
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.runtime.executor import executor_for
from digest_pipeline.services.cleanup import clean_period
from digest_pipeline.services.deliver import Deliverer, deliver_due
from digest_pipeline.services.wave import DeliveryReport
from digest_pipeline_tests.builders import digest_rows_for, key_of, make_deliverer, seed_period
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.fakes import FakeComposer, FakeMailer

THREADS = 8


def run_concurrently(n: int, target: Callable[[int], None]) -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(n)

    def body(i: int) -> None:
        barrier.wait()
        try:
            target(i)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


@pytest.mark.parametrize(
    ("backend", "items"),
    [("sqlite", 300), pytest.param("postgres", 2_000, marks=pytest.mark.integration)],
)
def test_concurrent_workers_claim_and_complete_each_item_exactly_once(
    backend, items, sql_engine_factory, clock
):
    ledger = SqlLedger(sql_engine_factory(backend))
    keys = seed_period(ledger, items, now=clock.now(), rows_per_customer=1)
    mailer = FakeMailer(idempotent=False, clock=clock)  # counts every delivery it is handed
    reports: list[DeliveryReport] = []

    def work(i: int) -> None:
        deliverer = Deliverer(
            ledger,
            mailer,
            FakeComposer(),
            clock,
            DeliveryPolicy(),
            random.Random(i).random,
            f"w{i}",
            executor_for(ledger),
        )
        reports.append(deliver_due(deliverer, batch_size=20, concurrency=1))

    run_concurrently(THREADS, work)
    assert sum(r.claimed for r in reports) == items
    assert sum(r.lost_races for r in reports) == 0
    assert len({r.claimed for r in reports}) > 1 or items < THREADS  # really shared out
    assert mailer.duplicate_deliveries == 0
    assert all(mailer.deliveries_for(k) == 1 for k in keys)
    final = ledger.items(W42)
    assert {i.state for i in final} == {DeliveryState.SENT}
    # one claim (fencing token 1) and one attempt per item: zero double claims
    assert {(i.lease_token, i.attempts) for i in final} == {(1, 1)}
    assert all(r.passed for r in ledger.check_invariants(W42, clock.now()))


@pytest.mark.parametrize(
    ("backend", "items"),
    [("sqlite", 200), pytest.param("postgres", 1_000, marks=pytest.mark.integration)],
)
def test_concurrent_cleanups_clean_each_key_once(backend, items, sql_engine_factory, clock):
    ledger = SqlLedger(sql_engine_factory(backend))
    seed_period(ledger, items, now=clock.now(), rows_per_customer=1)
    deliver_due(
        make_deliverer(ledger, FakeMailer(clock=clock), clock), batch_size=100, concurrency=4
    )
    cleaned: list[int] = []
    run_concurrently(
        4,
        lambda _: cleaned.append(clean_period(ledger, clock, W42, CleanupMode.ARCHIVE).cleaned),
    )
    assert sum(cleaned) == items
    with ledger.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(cleanups)).scalar_one() == items
        archived = conn.execute(select(func.count()).select_from(digest_rows_archive))
        assert archived.scalar_one() == items
    assert {i.state for i in ledger.items(W42)} == {DeliveryState.CLEANED}


def _planned(url: str, *settings: str) -> Engine:
    """A second engine on the ledger whose sessions plan under `settings` (`SET enable_… = off`)."""
    engine = create_ledger_engine(url)

    @event.listens_for(engine, "connect")
    def _plan(dbapi_connection: Any, _record: Any) -> None:
        with dbapi_connection.cursor() as cursor:
            for setting in settings:
                cursor.execute(setting)
        dbapi_connection.commit()

    return engine


def _waiting_on_locks(engine: Engine) -> int:
    query = text(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    with engine.connect() as conn:
        waiting: int = conn.execute(query).scalar_one()
    return waiting


def _race_past_the_middle_item(
    engine: Engine, items: int, act: Callable[[SqlLedger], Any]
) -> list[Any]:
    """Runs `act` on two ledgers at once over the same items, one planning its reads as a scan
    of the table and one through the key index, with the table's rows rewritten in descending
    key order; returns what each call returned (a call that raised returns nothing).

    The middle item is held locked until both calls wait on a lock, so their locking reads
    overlap whatever the machine's speed. Were the items locked in plan order, the scan would
    take them from the top and the index from the bottom, and PostgreSQL would abort one with
    `deadlock detected` once the middle item is let go.
    """
    with engine.begin() as conn:
        conn.execute(text("CREATE INDEX work_items_key_desc ON work_items (operation_key DESC)"))
        conn.execute(text("CLUSTER work_items USING work_items_key_desc"))
        conn.execute(text("DROP INDEX work_items_key_desc"))
        conn.execute(text("ANALYZE work_items"))
    url = engine.url.render_as_string(hide_password=False)
    scanning = _planned(url, "SET enable_indexscan = off", "SET enable_bitmapscan = off")
    indexed = _planned(url, "SET enable_seqscan = off", "SET enable_bitmapscan = off")
    results: list[Any] = []
    try:
        with engine.connect() as holder:
            holder.begin()
            middle = work_items.c.operation_key == str(key_of(items // 2))
            holder.execute(select(work_items.c.operation_key).where(middle).with_for_update())
            racers = [
                threading.Thread(target=lambda e=e: results.append(act(SqlLedger(e))))
                for e in (scanning, indexed)
            ]
            for t in racers:
                t.start()
            deadline = time.monotonic() + 120
            while _waiting_on_locks(engine) < 2:
                assert time.monotonic() < deadline, "the two calls never both waited on a lock"
                time.sleep(0.05)
            holder.rollback()
        for t in racers:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in racers)
    finally:
        scanning.dispose()
        indexed.dispose()
    return results


@pytest.mark.integration
def test_cleanups_planned_differently_lock_a_pages_items_in_one_order(sql_engine_factory, clock):
    """Each cleanup transaction locks its page's items in key order, whatever its plan."""
    items = 400
    engine = sql_engine_factory("postgres")
    ledger = SqlLedger(engine)
    seed_period(ledger, items, now=clock.now(), rows_per_customer=1)
    deliver_due(
        make_deliverer(ledger, FakeMailer(clock=clock), clock), batch_size=items, concurrency=4
    )

    reports = _race_past_the_middle_item(
        engine, items, lambda racer: clean_period(racer, clock, W42, CleanupMode.ARCHIVE)
    )

    # one cleaned the page; the other, let in after it, found every item already cleaned
    assert sorted((r.cleaned, r.already_cleaned) for r in reports) == [(0, items), (items, 0)]
    assert {i.state for i in ledger.items(W42)} == {DeliveryState.CLEANED}


@pytest.mark.integration
def test_content_replacements_planned_differently_lock_items_in_one_order(
    sql_engine_factory, clock
):
    """Regenerating a week's rows locks its items in key order, chunk after chunk, whatever the
    plan: two replacements of the same rows both finish, and each key keeps one set."""
    items, per_key = 400, 2
    engine = sql_engine_factory("postgres")
    ledger = SqlLedger(engine)
    keys = seed_period(ledger, items, now=clock.now(), rows_per_customer=1)
    rows = [row for n, k in enumerate(keys, 1) for row in digest_rows_for(k, n, per_key)]

    replacements = _race_past_the_middle_item(
        engine, items, lambda racer: racer.replace_digest_rows(keys, rows)
    )

    assert [len(r.replaced) for r in replacements] == [items, items]
    with engine.connect() as conn:
        stored = conn.execute(select(func.count()).select_from(digest_rows)).scalar_one()
    assert stored == items * per_key
