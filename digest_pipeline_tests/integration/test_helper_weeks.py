"""Consecutive weeks on one PostgreSQL ledger, each delivered with a helper in every batch step.

`digest run` (the default in-process executor, `DIGEST_DELIVERY_PROCESSES=2`) sends each week
to the HTTP provider on loopback, which fails some sends once (503), throttles some (429 with
Retry-After) and stores some, then drops the connection before it answers (the worker cannot
know: `unknown`, settled by the run and resent inside the provider's idempotency window, which
answers with the stored message). `digest sweep` then delivers the retries. After every week,
over every week so far: every item finished, every invariant holds, the provider stored each
sent key once and no other, and the helpers took part (attempts under `<owner>/p1`).
"""

from collections import Counter
from collections.abc import Iterator

import pytest
from sqlalchemy import func, select

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
from digest_pipeline.rigs.servers.provider_actions import Action, status, store_then_drop
from digest_pipeline.rigs.servers.provider_server import ProviderServer
from digest_pipeline_tests.conftest import require_postgres_url, require_url
from digest_pipeline_tests.integration.provider_weeks import (
    assert_week_done_once,
    ledger,
    states,
    sweep_until_finished,
)

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


def _fault(n: int) -> Action | None:
    """What the provider does with customer `n`'s first request each week (None: accepts)."""
    if n % DROPPED == 0:
        return store_then_drop()
    if n % THROTTLED == 0:
        return status(429, "rate_limit_exceeded", retry_after=1)
    if n % TRANSIENT == 0:
        return status(503, "service_unavailable")
    return None


def _script(provider: ProviderServer, period: Period) -> None:
    for n in range(1, CUSTOMERS + 1):
        if (action := _fault(n)) is not None:
            provider.script(f"digest:{period}:customer-{n:04d}", action)


def _helped(rig: CeleryRig, period: Period) -> int:
    """Attempts a helper recorded for the period (owners `<run>:<batch>/p1`)."""
    with ledger(rig) as conn:
        return int(
            conn.execute(
                select(func.count())
                .select_from(attempts)
                .join(work_items, work_items.c.operation_key == attempts.c.operation_key)
                .where(work_items.c.period == str(period), attempts.c.worker.like("%/p1"))
            ).scalar_one()
        )


def test_consecutive_weeks_with_helpers_deliver_each_item_once(
    shop: CeleryRig, provider: ProviderServer
) -> None:
    for done, period in enumerate(WEEKS, 1):
        _script(provider, period)
        code, output = finished(shop.digest("run", "--period", str(period)))
        assert code == 0, output
        sweep_until_finished(shop, period)
        # the faults happened: every scripted key the week sent was asked for again after its
        # first request failed, was refused or went unanswered, and was stored once (below)
        asked = Counter(
            r.headers.get("Idempotency-Key") for r in provider.received if r.path == "/emails"
        )
        sent = {k for k, s in states(shop, period).items() if s == DeliveryState.CLEANED}
        faulty = {k for k in sent if _fault(int(k.rsplit("-", 1)[1])) is not None}
        assert faulty, f"{period}: no scripted fault among the week's sends"
        assert {k: asked[k] for k in faulty if asked[k] < 2} == {}
        # every week so far, after this one: a later week never disturbs an earlier one
        for earlier in WEEKS[:done]:
            assert_week_done_once(shop, provider, earlier)
            assert _helped(shop, earlier) > 0, f"{earlier}: no helper recorded an attempt"
