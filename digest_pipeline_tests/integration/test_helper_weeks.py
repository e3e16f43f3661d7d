"""Consecutive weeks on one PostgreSQL ledger, each delivered with a helper in every batch step.

`digest run` (the default in-process executor, `DIGEST_DELIVERY_PROCESSES=2`) sends each week
to the HTTP provider on loopback, which fails some sends once (503), throttles some (429 with
Retry-After) and stores some, then drops the connection before it answers (the worker cannot
know: `unknown`, settled by the run and resent inside the provider's idempotency window, which
answers with the stored message). `digest sweep` then delivers the retries. After every week,
over every week so far: every item finished, every invariant holds, the provider stored each
sent key once and no other, and the helpers took part (attempts under `<owner>/p1`).
"""

import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import func, select

from digest_pipeline.adapters.sql.engine import create_ledger_engine
from digest_pipeline.adapters.sql.invariants import evaluate_invariants
from digest_pipeline.adapters.sql.schema import attempts, work_items
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.rigs.servers.celery_rig import (
    CeleryRig,
    finished,
    fresh_database,
    provider_settings,
    seeded_ledger,
)
from digest_pipeline.rigs.servers.provider_server import (
    ProviderServer,
    status,
    store_then_drop,
)
from digest_pipeline_tests.conftest import require_postgres_url, require_url

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

CUSTOMERS = 600
WEEKS = tuple(Period(2026, w) for w in range(42, 46))
#: customer numbers whose send fails once (503), is throttled once (429), or is stored and then
#: left unanswered, each week
TRANSIENT, THROTTLED, DROPPED = 7, 11, 29


@pytest.fixture(scope="module")
def provider() -> Iterator[ProviderServer]:
    with ProviderServer() as server:
        yield server


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory, provider: ProviderServer) -> CeleryRig:
    """A launcher folder for `digest run`: no workers, the steps run in its process."""
    ledger_url, _ = seeded_ledger(
        require_postgres_url(), "digest_helper_weeks", customers=CUSTOMERS, seed=13
    )
    dagster_url = fresh_database(require_url("DAGSTER_TEST_PG_URL"), "dagster_helper_weeks")
    settings = provider_settings(
        ledger_url,
        None,
        provider,
        DIGEST_DELIVERY_PROCESSES="2",
        # about three batch steps a week, each with a helper
        DIGEST_BATCH_SIZE="100",
        DIGEST_CONCURRENCY="4",
        DIGEST_RETRY_BASE_SECONDS="1",
        DIGEST_RETRY_CAP_SECONDS="2",
    )
    return CeleryRig(tmp_path_factory.mktemp("helper-weeks"), settings, dagster_url)


def _script(provider: ProviderServer, period: Period) -> None:
    for n in range(1, CUSTOMERS + 1):
        key = f"digest:{period}:customer-{n:04d}"
        if n % DROPPED == 0:
            provider.script(key, store_then_drop())
        elif n % THROTTLED == 0:
            provider.script(key, status(429, "rate_limit_exceeded", retry_after=1))
        elif n % TRANSIENT == 0:
            provider.script(key, status(503, "service_unavailable"))


def _states(url: str, period: Period) -> dict[str, str]:
    engine = create_ledger_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                select(work_items.c.operation_key, work_items.c.state).where(
                    work_items.c.period == str(period)
                )
            ).all()
    finally:
        engine.dispose()
    return {key: state for key, state in rows}


def _finished(states: dict[str, str]) -> bool:
    return all(s in (DeliveryState.CLEANED, DeliveryState.FAILED) for s in states.values())


def _assert_weeks_once(url: str, provider: ProviderServer, weeks: tuple[Period, ...]) -> None:
    """Every week so far: finished, invariants holding, each sent key stored once."""
    stored = provider.stored
    engine = create_ledger_engine(url)
    try:
        with engine.connect() as conn:
            for period in weeks:
                failed = [
                    r.name
                    for r in evaluate_invariants(conn, period, datetime.now(UTC))
                    if not r.passed
                ]
                assert failed == [], f"{period}: invariants violated: {failed}"
                helped = conn.execute(
                    select(func.count())
                    .select_from(attempts)
                    .join(work_items, work_items.c.operation_key == attempts.c.operation_key)
                    .where(work_items.c.period == str(period), attempts.c.worker.like("%/p1"))
                ).scalar_one()
                assert helped > 0, f"{period}: no helper recorded an attempt"
    finally:
        engine.dispose()
    for period in weeks:
        states = _states(url, period)
        assert states, f"{period} has no work items"
        assert _finished(states), f"{period}: not finished: {states}"
        cleaned = {k for k, s in states.items() if s == DeliveryState.CLEANED}
        assert {k for k in stored if k.startswith(f"digest:{period}:")} == cleaned
        twice = {k: len(stored[k]) for k in cleaned if len(stored[k]) != 1}
        assert twice == {}, f"{period}: messages stored more than once: {twice}"


def test_consecutive_weeks_with_helpers_deliver_each_item_once(
    shop: CeleryRig, provider: ProviderServer
) -> None:
    url = shop.settings["DIGEST_DATABASE_URL"]
    for done, period in enumerate(WEEKS, 1):
        _script(provider, period)
        code, output = finished(shop.digest("run", "--period", str(period)))
        assert code == 0, output
        # the retries the run scheduled (due within seconds) the sweep delivers and cleans
        for _ in range(15):
            if _finished(_states(url, period)):
                break
            time.sleep(2)
            code, output = finished(shop.digest("sweep"))
            assert code == 0, output
        _assert_weeks_once(url, provider, WEEKS[:done])
