"""The UI and `digest run` share one job: runs of either are the job's, and launching is cheap.

2026-W42 is seeded and delivered by the real `digest run` console script into a SQLite
DAGSTER_HOME made from the project's `dagster.yaml`; then `dagster dev` (what `make ui` runs:
webserver and daemon, since the project's QueuedRunCoordinator needs the daemon to start a run)
serves that home. The tests ask the GraphQL the UI asks: the job's Runs tab lists the
`digest run` run with the snapshot the code location reports, and "Materialize all" for the
delivered week runs in process (the project's default executor) and sends nothing new.

On a PostgreSQL ledger, a UI launch's delivery steps fork their helper processes
(`DIGEST_DELIVERY_PROCESSES`) beside the run worker's own threads, in process and multiprocess.
"""

import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest
from sqlalchemy import func, select

from digest_pipeline.adapters.sql.engine import create_ledger_engine
from digest_pipeline.adapters.sql.invariants import evaluate_invariants
from digest_pipeline.adapters.sql.schema import attempts, work_items
from digest_pipeline.definitions import defs
from digest_pipeline.defs.execution import digest_executor
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.instance import prepare_home
from digest_pipeline.rigs.bootstrap import PROJECT_ROOT
from digest_pipeline.rigs.servers.celery_rig import seeded_ledger
from digest_pipeline.rigs.servers.webserver import (
    JOB,
    LOCATION,
    PARTITION,
    REPOSITORY,
    Webserver,
    digest_run,
    job_runs,
    launch_partition,
    location_snapshot_id,
    run_messages,
    running_webserver,
    seed_week,
    wait_for_run,
)
from digest_pipeline_tests.conftest import W42, hermetic_environ, require_postgres_url

# digest run (~10 s) and `dagster dev` start-up (~15 s) are set up once for the module
pytestmark = pytest.mark.timeout(600)


@dataclass(frozen=True)
class DeliveredWeek:
    server: Webserver
    #: the run `digest run` printed
    run_id: str
    ledger_url: str
    outbox: Path


#: prints the job's snapshot id as a freshly started process computes it
SNAPSHOT_ID = (
    "from digest_pipeline.definitions import defs; "
    f"print(defs().resolve_job_def({JOB!r}).get_job_snapshot_id())"
)


def attempt_count(url: str) -> int:
    engine = create_ledger_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(attempts)).scalar_one())
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def delivered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DeliveredWeek]:
    """W42 delivered by `digest run`, then `dagster dev` serving its DAGSTER_HOME."""
    tmp = tmp_path_factory.mktemp("ui-launch")
    seeded = seed_week(tmp / "ledger")
    home = prepare_home(PROJECT_ROOT, {}, tmp / "home")
    env = {**hermetic_environ(), **seeded, "DAGSTER_HOME": str(home)}
    run_id = digest_run(env, str(W42))
    with running_webserver(env, tmp / "logs", dev=True, stop_timeout=60) as server:
        yield DeliveredWeek(
            server, run_id, seeded["DIGEST_DATABASE_URL"], Path(seeded["DIGEST_OUTBOX_DIR"])
        )


def test_a_digest_run_is_listed_under_the_job_with_the_code_locations_snapshot(delivered):
    listed = {r["runId"]: r for r in job_runs(delivered.server)}
    assert delivered.run_id in listed, listed  # the job's Runs tab shows it
    run = listed[delivered.run_id]
    assert run["pipelineName"] == JOB
    assert run["status"] == "SUCCESS"
    # the Overview timeline places a run in its job's row by this origin; without it, "jobless"
    assert run["repositoryOrigin"] == {
        "repositoryName": REPOSITORY,
        "repositoryLocationName": LOCATION,
    }
    # one job snapshot: the one the served code location (another process) reports
    assert run["pipelineSnapshotId"] == location_snapshot_id(delivered.server)
    assert {"key": "dagster/partition", "value": PARTITION} in run["tags"]


def test_materializing_a_delivered_week_from_the_ui_runs_in_process_and_sends_nothing(delivered):
    sent = sorted(p.name for p in (delivered.outbox / "new").iterdir())
    tried = attempt_count(delivered.ledger_url)
    assert sent
    assert tried > 0

    run_id = launch_partition(delivered.server, PARTITION)
    run = wait_for_run(delivered.server, run_id, timeout=300)

    assert run["status"] == "SUCCESS", run_messages(delivered.server, run_id)[-20:]
    assert {"key": "dagster/partition", "value": PARTITION} in run["tags"]
    messages = run_messages(delivered.server, run_id)
    assert any(m.startswith("Executing steps in process") for m in messages), messages
    assert not any("multiprocess executor" in m for m in messages)
    # the ledger already had every item settled: no new message, no new attempt
    assert sorted(p.name for p in (delivered.outbox / "new").iterdir()) == sent
    assert attempt_count(delivered.ledger_url) == tried
    # a launch of the whole job is the job's run too (a subset of its snapshot)
    assert run["parentPipelineSnapshotId"] in (None, location_snapshot_id(delivered.server))
    assert run_id in {r["runId"] for r in job_runs(delivered.server)}


def test_every_job_runs_in_process_unless_the_run_config_asks_for_multiprocess():
    repo = defs().get_repository_def()
    sweeper = repo.get_sensor_def("digest_retry_sweeper").job_name
    assert sweeper is not None
    # the schedule's and launchpad's job, the asset graph's "Materialize", the sensor's runs
    for name in (JOB, "__ASSET_JOB", sweeper):
        assert repo.get_job(name).executor_def is digest_executor, name
    job = repo.get_job(JOB)
    [default] = dg.validate_run_config(job, {})["execution"].values()
    assert set(default) == {"in_process"}
    multiprocess = {"execution": {"config": {"multiprocess": {"max_concurrent": 2}}}}
    [chosen] = dg.validate_run_config(job, multiprocess)["execution"].values()
    assert chosen["multiprocess"]["max_concurrent"] == 2


def test_the_jobs_snapshot_id_is_the_same_in_every_process():
    # Dagster breaks ties between blocking checks by set order (an address, on Python 3.11);
    # defs/execution.py orders them by name, so each process agrees with the code server's
    ids = {
        subprocess.run(
            [sys.executable, "-c", SNAPSHOT_ID],
            cwd=PROJECT_ROOT,
            env=hermetic_environ(),
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()[-1]
        for _ in range(3)
    }
    assert ids == {defs().resolve_job_def(JOB).get_job_snapshot_id()}


#: a UI launch on PostgreSQL with a helper per delivery step: 600 customers, 2 batch steps
HELPER_SHOP = {"DIGEST_DELIVERY_PROCESSES": "2", "DIGEST_BATCH_SIZE": "150"}


def _settled_once(url: str, period: Period) -> tuple[Counter[str], dict[str, int]]:
    """The period's items by state, and the keys with other than one attempt (none, if once).

    Fails if any ledger invariant does not hold.
    """
    engine = create_ledger_engine(url)
    try:
        with engine.connect() as conn:
            states = dict(
                conn.execute(
                    select(work_items.c.operation_key, work_items.c.state).where(
                        work_items.c.period == str(period)
                    )
                ).all()
            )
            tries = Counter(
                conn.execute(
                    select(attempts.c.operation_key).where(attempts.c.operation_key.in_(states))
                ).scalars()
            )
            failed = [
                r.name for r in evaluate_invariants(conn, period, datetime.now(UTC)) if not r.passed
            ]
    finally:
        engine.dispose()
    assert failed == [], f"{period}: invariants violated: {failed}"
    return Counter(states.values()), {k: n for k in states if (n := tries[k]) != 1}


@pytest.mark.integration
def test_a_ui_launch_on_postgresql_delivers_with_helper_processes(tmp_path):
    url, _ = seeded_ledger(require_postgres_url(), "digest_ui_helpers", customers=600, seed=3)
    # the runs use the real clock: keep the seeded weeks' delivery window open (as seed_week)
    window = datetime.now(UTC) + timedelta(days=1) - W42.ends_at
    home = prepare_home(PROJECT_ROOT, {}, tmp_path / "home")
    env = {
        **hermetic_environ(),
        **HELPER_SHOP,
        "DIGEST_DATABASE_URL": url,
        "DIGEST_MAILER": "outbox",
        "DIGEST_OUTBOX_DIR": str(tmp_path / "outbox"),
        "DIGEST_DELIVERY_WINDOW_SECONDS": str(int(window.total_seconds())),
        "DAGSTER_HOME": str(home),
    }
    w43 = Period(2026, 43)
    with running_webserver(env, tmp_path / "logs", dev=True, stop_timeout=60) as server:
        for period, config in ((W42, None), (w43, {"execution": {"config": {"multiprocess": {}}}})):
            run_id = launch_partition(server, period.partition_key, run_config=config)
            run = wait_for_run(server, run_id, timeout=300)
            messages = run_messages(server, run_id)
            assert run["status"] == "SUCCESS", messages[-20:]
            # every batch step forked its helper: none delivered alone (`why=...`)
            helped = [m for m in messages if m.startswith("event=delivered_in_processes")]
            assert helped, messages
            assert all(" processes=2 " in m for m in helped), helped
            assert not [m for m in messages if m.startswith("event=delivery_processes")]
            states, not_once = _settled_once(url, period)
            assert not_once == {}, f"{period}: keys not tried exactly once: {not_once}"
            assert set(states) <= {DeliveryState.CLEANED, DeliveryState.FAILED}, states
            assert states[DeliveryState.CLEANED] > 0
