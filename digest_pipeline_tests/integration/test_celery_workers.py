"""Delivery batches on two real Celery workers with their own disks, on Redis and PostgreSQL.

A 1,000-customer shop is seeded into a fresh PostgreSQL ledger; the launcher (`digest run`, its
own folder) and two `dagster-celery` workers (each its own folder, `DAGSTER_HOME` and working
directory) share only the Redis broker, the ledger and a fresh PostgreSQL Dagster storage. The
mailer is the HTTP provider on loopback, answering each request after 50 ms. The tests assert
what the README promises: batch steps run on both workers, nothing a step needs is on the
launcher's disk, every invariant holds, no message is stored twice at the provider; a worker
with other settings refuses its step; and a worker process killed in the middle of a batch
fails the run, after which a re-run finishes the week with nothing lost and nothing sent twice.
"""

import math
import os
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import Engine, func, select

from digest_pipeline.adapters.sql.engine import create_ledger_engine
from digest_pipeline.adapters.sql.invariants import evaluate_invariants
from digest_pipeline.adapters.sql.schema import attempts, eligibility_snapshot, work_items
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.rigs.servers.celery_rig import (
    CeleryRig,
    finished,
    fresh_database,
    provider_settings,
    run_id_of,
    seeded_ledger,
    step_workers,
)
from digest_pipeline.rigs.servers.provider_server import ProviderServer
from digest_pipeline_tests.conftest import (
    require_postgres_url,
    require_redis_url,
    require_url,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]

CUSTOMERS = 1_000
W42, W43 = Period(2026, 42), Period(2026, 43)
#: 7 batches a week, each long enough (125 sends, two at a time, 50 ms each) to be killed inside
BATCH_SIZE, CONCURRENCY = 125, 2
#: short, so the re-run after the kill finds the dead step's leases expired without a long wait
LEASE_SECONDS = 10


@pytest.fixture(scope="module")
def provider() -> Iterator[ProviderServer]:
    with ProviderServer(latency_seconds=0.05) as server:
        yield server


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory, provider: ProviderServer) -> Iterator[CeleryRig]:
    broker = require_redis_url()
    ledger_url, _ = seeded_ledger(
        require_postgres_url(), "digest_celery", customers=CUSTOMERS, seed=11
    )
    dagster_url = fresh_database(require_url("DAGSTER_TEST_PG_URL"), "dagster_celery")
    settings = provider_settings(
        ledger_url,
        broker,
        provider,
        DIGEST_BATCH_SIZE=str(BATCH_SIZE),
        DIGEST_CONCURRENCY=str(CONCURRENCY),
        DIGEST_LEASE_SECONDS=str(LEASE_SECONDS),
        # the dead step's claimed-but-unsent items come back as retries: due within seconds
        DIGEST_RETRY_BASE_SECONDS="1",
        DIGEST_RETRY_CAP_SECONDS="2",
    )
    rig = CeleryRig(tmp_path_factory.mktemp("celery"), settings, dagster_url)
    try:
        yield rig
    finally:
        rig.stop_workers()


@pytest.fixture(autouse=True)
def _workers_stop(rig: CeleryRig) -> Iterator[None]:
    yield
    rig.stop_workers()


def _ledger(rig: CeleryRig) -> Engine:
    return create_ledger_engine(rig.settings["DIGEST_DATABASE_URL"])


def _states(rig: CeleryRig, period: Period) -> dict[str, str]:
    engine = _ledger(rig)
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


def _assert_week_done_once(rig: CeleryRig, provider: ProviderServer, period: Period) -> None:
    """Every item finished, every invariant holds, and the provider stored each key once."""
    states = _states(rig, period)
    assert states, f"{period} has no work items"
    open_states = {
        k: s for k, s in states.items() if s not in (DeliveryState.CLEANED, DeliveryState.FAILED)
    }
    assert open_states == {}, f"{period}: items not finished: {open_states}"
    engine = _ledger(rig)
    try:
        with engine.connect() as conn:
            failed = [
                r.name for r in evaluate_invariants(conn, period, datetime.now(UTC)) if not r.passed
            ]
    finally:
        engine.dispose()
    assert failed == [], f"{period}: invariants violated: {failed}"
    stored = provider.stored
    cleaned = {k for k, s in states.items() if s == DeliveryState.CLEANED}
    assert {k for k in stored if k in states} == cleaned, "sent items are those the provider holds"
    twice = {k: len(v) for k, v in stored.items() if k in states and len(v) != 1}
    assert twice == {}, f"messages stored more than once: {twice}"


@pytest.mark.parametrize(
    ("missing", "line"),
    [
        # without it the worker would 'deliver' into an outbox folder of its own
        ("DIGEST_MAILER", "DIGEST_MAILER is not set here"),
        # the run's Dagster storage: Dagster itself refuses, before the project's code runs
        ("DAGSTER_PG_URL", "DAGSTER_PG_URL"),
    ],
)
def test_a_worker_without_the_runs_settings_refuses_its_step(
    rig: CeleryRig, missing: str, line: str
) -> None:
    rig.start_worker("stray", drop=(missing,))
    code, output = finished(rig.digest("run", "--period", str(W42)))
    assert code != 0, output
    summary = output.split("\n\nstate", 1)[0]  # the lines before the summary table
    assert line in summary, output
    engine = _ledger(rig)
    try:
        with engine.connect() as conn:
            frozen = conn.execute(select(func.count()).select_from(eligibility_snapshot)).scalar()
            tried = conn.execute(select(func.count()).select_from(attempts)).scalar()
    finally:
        engine.dispose()
    assert (frozen, tried) == (0, 0), "the refused step recorded nothing"
    assert not (rig.root / "stray" / ".digest").exists(), "no local ledger or outbox was made"


def test_two_workers_deliver_a_week_with_no_shared_disk(
    rig: CeleryRig, provider: ProviderServer
) -> None:
    rig.start_worker("w1")
    rig.start_worker("w2")
    code, output = finished(rig.digest("run", "--period", str(W42)))
    assert code == 0, output
    run_id = run_id_of(output)
    with rig.instance() as instance:
        ran_on = step_workers(instance, run_id)
    batches = {k: w for k, w in ran_on.items() if ".deliver_batch[" in k}
    expected = math.ceil(len(_states(rig, W42)) / BATCH_SIZE)
    assert sorted(batches) == [
        f"digest_deliveries.deliver_batch[batch_{i:04d}]" for i in range(expected)
    ], ran_on
    assert {w.split("@")[0] for w in batches.values()} == {"w1", "w2"}, batches
    # no step output (nor anything else a step reads) on the launcher's disk
    storage = rig.launcher / "dagster_home" / "storage"
    files = [p for p in storage.rglob("*") if p.is_file()] if storage.exists() else []
    assert files == [], files
    _assert_week_done_once(rig, provider, W42)


def _batch_in_flight(rig: CeleryRig, run_id: str, worker: str) -> str | None:
    """A batch step running on `worker` with at least 10 sends recorded and more to come."""
    with rig.instance() as instance:
        mine = [k for k, w in step_workers(instance, run_id).items() if w.startswith(worker + "@")]
        done = {
            r.dagster_event.step_key
            for r in instance.all_logs(run_id)
            if r.dagster_event is not None and r.dagster_event.is_step_success
        }
    engine = _ledger(rig)
    try:
        with engine.connect() as conn:
            for step in (k for k in mine if ".deliver_batch[" in k and k not in done):
                owner = f"{run_id[:8]}:{step.split('[')[1].rstrip(']')}"
                sent = conn.execute(
                    select(func.count())
                    .select_from(attempts)
                    .where(attempts.c.worker == owner, attempts.c.finished_at.is_not(None))
                ).scalar_one()
                if 10 <= sent < BATCH_SIZE - 20:
                    return owner
    finally:
        engine.dispose()
    return None


def test_a_worker_killed_inside_a_batch_fails_the_run_and_a_rerun_finishes_the_week(
    rig: CeleryRig, provider: ProviderServer
) -> None:
    w1 = rig.start_worker("w1")
    w2 = rig.start_worker("w2")
    assert w1.process.poll() is None
    launcher = rig.digest("run", "--period", str(W43))
    run_id = ""
    owner = None
    deadline = time.monotonic() + 600
    while owner is None:
        assert launcher.poll() is None, finished(launcher)[1]
        assert time.monotonic() < deadline, "no batch ever ran on w2"
        time.sleep(0.05)
        if not run_id:
            with rig.instance() as instance:
                runs = instance.get_runs(limit=1)
            if runs and runs[0].tags.get("dagster/partition") == W43.partition_key:
                run_id = runs[0].run_id
            continue
        owner = _batch_in_flight(rig, run_id, "w2")
    pool = w2.pool_pids()
    assert pool, w2.log
    for pid in pool:
        os.kill(pid, signal.SIGKILL)
    code, output = finished(launcher)
    assert code != 0, output
    # the kill landed inside the batch: some of its items went out, some did not
    engine = _ledger(rig)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                select(work_items.c.state).where(work_items.c.lease_owner == owner)
            ).scalars()
            left = [s for s in rows if s not in (DeliveryState.SENT, DeliveryState.CLEANED)]
    finally:
        engine.dispose()
    assert left, "the killed batch had finished before the kill"
    # the dead step's leases run out (real time: the workers' clocks are real); then the re-run,
    # on either worker (w2's main process started a new pool process), takes the week over
    time.sleep(LEASE_SECONDS + 1)
    code, output = finished(rig.digest("run", "--period", str(W43)))
    assert code == 0, output
    # what the re-run found not yet due (the dead claim's retries) the sweep delivers
    for _ in range(10):
        if all(
            s in (DeliveryState.CLEANED, DeliveryState.FAILED) for s in _states(rig, W43).values()
        ):
            break
        time.sleep(2)
        code, output = finished(rig.digest("sweep"))
        assert code == 0, output
    _assert_week_done_once(rig, provider, W43)
