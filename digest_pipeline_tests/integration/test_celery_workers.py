"""Delivery batches on two real Celery workers with their own disks, on Redis and PostgreSQL.

A 1,000-customer shop is seeded into a fresh PostgreSQL ledger; the launcher (`digest run`, its
own folder) and two `dagster-celery` workers (each its own folder, `DAGSTER_HOME` and working
directory) share only the Redis broker, the ledger and a fresh PostgreSQL Dagster storage. The
mailer is the HTTP provider on loopback, answering each request after 50 ms. The tests assert
what docs/how-to/celery-kubernetes.md promises: batch steps run on both workers, nothing a step needs is on the
launcher's disk, every invariant holds, no message is stored twice at the provider; a worker
with other settings refuses its step; and a worker process killed in the middle of a batch
fails the run, after which a re-run finishes the week with nothing lost and nothing sent twice.
"""

import math
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import func, select

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
from digest_pipeline_tests.integration.provider_weeks import (
    assert_week_done_once,
    ledger,
    states,
    sweep_until_finished,
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
    rig = _shop(tmp_path_factory, provider, "celery", seed=11)
    try:
        yield rig
    finally:
        rig.stop_workers()


def _shop(
    tmp_path_factory: pytest.TempPathFactory,
    provider: ProviderServer,
    name: str,
    *,
    seed: int,
    **extra: str,
) -> CeleryRig:
    """A launcher for a fresh shop: ledger `digest_<name>`, Dagster storage `dagster_<name>`."""
    ledger_url, _ = seeded_ledger(
        require_postgres_url(), f"digest_{name}", customers=CUSTOMERS, seed=seed
    )
    dagster_url = fresh_database(require_url("DAGSTER_TEST_PG_URL"), f"dagster_{name}")
    settings = provider_settings(
        ledger_url,
        require_redis_url(),
        provider,
        DIGEST_BATCH_SIZE=str(BATCH_SIZE),
        DIGEST_CONCURRENCY=str(CONCURRENCY),
        DIGEST_LEASE_SECONDS=str(LEASE_SECONDS),
        # the dead step's claimed-but-unsent items come back as retries: due within seconds
        DIGEST_RETRY_BASE_SECONDS="1",
        DIGEST_RETRY_CAP_SECONDS="2",
        **extra,
    )
    return CeleryRig(tmp_path_factory.mktemp(name), settings, dagster_url)


@pytest.fixture(autouse=True)
def _workers_stop(rig: CeleryRig) -> Iterator[None]:
    yield
    rig.stop_workers()


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
    with ledger(rig) as conn:
        frozen = conn.execute(select(func.count()).select_from(eligibility_snapshot)).scalar()
        tried = conn.execute(select(func.count()).select_from(attempts)).scalar()
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
    expected = math.ceil(len(states(rig, W42)) / BATCH_SIZE)
    assert sorted(batches) == [
        f"digest_deliveries.deliver_batch[batch_{i:04d}]" for i in range(expected)
    ], ran_on
    assert {w.split("@")[0] for w in batches.values()} == {"w1", "w2"}, batches
    # no step output (nor anything else a step reads) on the launcher's disk
    storage = rig.launcher / "dagster_home" / "storage"
    files = [p for p in storage.rglob("*") if p.is_file()] if storage.exists() else []
    assert files == [], files
    assert_week_done_once(rig, provider, W42)


def _batch_in_flight(rig: CeleryRig, run_id: str, worker: str) -> str | None:
    """A batch step running on `worker` with at least 10 sends recorded and more to come."""
    with rig.instance() as instance:
        mine = [k for k, w in step_workers(instance, run_id).items() if w.startswith(worker + "@")]
        done = {
            r.dagster_event.step_key
            for r in instance.all_logs(run_id)
            if r.dagster_event is not None and r.dagster_event.is_step_success
        }
    with ledger(rig) as conn:
        for step in (k for k in mine if ".deliver_batch[" in k and k not in done):
            owner = f"{run_id[:8]}:{step.split('[')[1].rstrip(']')}"
            sent = conn.execute(
                select(func.count())
                .select_from(attempts)
                .where(attempts.c.worker == owner, attempts.c.finished_at.is_not(None))
            ).scalar_one()
            if 10 <= sent < BATCH_SIZE - 20:
                return owner
    return None


def _launch_until_a_batch_is_in_flight(
    rig: CeleryRig, period: Period, worker: str
) -> tuple["subprocess.Popen[str]", str, str]:
    """Launches `digest run` for the week; returns it, its run id and a batch in flight on
    `worker` (the batch step's owner), as soon as there is one."""
    launcher = rig.digest("run", "--period", str(period))
    run_id = ""
    owner = None
    deadline = time.monotonic() + 600
    while owner is None:
        assert launcher.poll() is None, finished(launcher)[1]
        assert time.monotonic() < deadline, f"no batch ever ran on {worker}"
        time.sleep(0.05)
        if not run_id:
            if not (rig.launcher / "dagster_home").is_dir():
                continue  # `digest run` has not made its Dagster home yet
            with rig.instance() as instance:
                runs = instance.get_runs(limit=1)
            if runs and runs[0].tags.get("dagster/partition") == period.partition_key:
                run_id = runs[0].run_id
            continue
        owner = _batch_in_flight(rig, run_id, worker)
    return launcher, run_id, owner


def test_a_worker_killed_inside_a_batch_fails_the_run_and_a_rerun_finishes_the_week(
    rig: CeleryRig, provider: ProviderServer
) -> None:
    w1 = rig.start_worker("w1")
    w2 = rig.start_worker("w2")
    assert w1.process.poll() is None
    launcher, _, owner = _launch_until_a_batch_is_in_flight(rig, W43, "w2")
    pool = w2.pool_pids()
    assert pool, w2.log
    for pid in pool:
        os.kill(pid, signal.SIGKILL)
    code, output = finished(launcher)
    assert code != 0, output
    # the kill landed inside the batch: some of its items went out, some did not
    with ledger(rig) as conn:
        rows = conn.execute(
            select(work_items.c.state).where(work_items.c.lease_owner == owner)
        ).scalars()
        left = [s for s in rows if s not in (DeliveryState.SENT, DeliveryState.CLEANED)]
    assert left, "the killed batch had finished before the kill"
    _finish_after_the_kill(rig, provider, W43)


def _finish_after_the_kill(rig: CeleryRig, provider: ProviderServer, period: Period) -> None:
    """Re-runs the week once the dead step's leases run out, sweeps, and checks it was once."""
    # real time: the workers' clocks are real; the re-run takes the week over on either
    # worker (the killed pool process's worker started a new one)
    time.sleep(LEASE_SECONDS + 1)
    code, output = finished(rig.digest("run", "--period", str(period)))
    assert code == 0, output
    # what the re-run found not yet due (the dead claim's retries) the sweep delivers
    sweep_until_finished(rig, period)
    assert_week_done_once(rig, provider, period)


@pytest.fixture(scope="module")
def helper_provider() -> Iterator[ProviderServer]:
    """The helper shop's own provider: the other shop sends the same keys with other content,
    which one provider would rightly refuse as a conflict (409) and the ledger dead-letter."""
    with ProviderServer(latency_seconds=0.05) as server:
        yield server


@pytest.fixture(scope="module")
def helper_rig(
    tmp_path_factory: pytest.TempPathFactory, helper_provider: ProviderServer
) -> Iterator[CeleryRig]:
    """A shop of its own whose batch steps each fork a delivery helper."""
    rig = _shop(
        tmp_path_factory, helper_provider, "celery_helpers", seed=12, DIGEST_DELIVERY_PROCESSES="2"
    )
    try:
        yield rig
    finally:
        rig.stop_workers()


def _alive(pid: int) -> bool:
    """Whether the process exists and has not ended (a zombie has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def test_a_killed_step_process_takes_its_delivery_helper_with_it(
    helper_rig: CeleryRig, helper_provider: ProviderServer
) -> None:
    # the other shop's workers (same broker) are stopped after each test; this one has its own
    worker = helper_rig.start_worker("h1")
    try:
        launcher, _, owner = _launch_until_a_batch_is_in_flight(helper_rig, W42, "h1")
        steps, helpers = worker.pool_pids(), worker.helper_pids()
        assert helpers, "the batch step forked no helper"
        killed_at = datetime.now(UTC)
        for pid in steps:
            os.kill(pid, signal.SIGKILL)
        # the helper dies with its step (PR_SET_PDEATHSIG), not only at its next claim
        deadline = time.monotonic() + 60
        while any(_alive(pid) for pid in helpers):
            assert time.monotonic() < deadline, f"helpers {helpers} outlived their step"
            time.sleep(0.1)
        code, output = finished(launcher)
        assert code != 0, output
    finally:
        helper_rig.stop_workers()
    with ledger(helper_rig) as conn:
        after = conn.execute(
            select(func.count())
            .select_from(attempts)
            .where(attempts.c.worker == f"{owner}/p1", attempts.c.started_at > killed_at)
        ).scalar_one()
    # at most the one wave it was starting as the kill landed; a helper that lived on to its
    # next claim would have started the rest of its claim (8 waves)
    assert after <= CONCURRENCY, f"the helper started {after} sends after its step was killed"
    helper_rig.start_worker("h2")
    try:
        _finish_after_the_kill(helper_rig, helper_provider, W42)
    finally:
        helper_rig.stop_workers()
