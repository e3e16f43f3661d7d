"""Concurrent workers on one SQL ledger: every item claimed, sent and cleaned exactly once.

On PostgreSQL the claims race through `FOR UPDATE SKIP LOCKED`; on SQLite through serialized
`BEGIN IMMEDIATE` transactions. Evidence comes from the ledger (one attempt and fencing token 1
per item) and from the provider's own record (one delivery per key).
"""

import random
import threading
from collections.abc import Callable

import pytest
from sqlalchemy import func, select

from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.adapters.sql.schema import cleanups, digest_rows_archive
from digest_pipeline.domain.model import CleanupMode
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.services.cleanup import clean_period
from digest_pipeline.services.deliver import Deliverer, DeliveryReport, deliver_due
from digest_pipeline_tests.builders import make_deliverer, seed_period
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
