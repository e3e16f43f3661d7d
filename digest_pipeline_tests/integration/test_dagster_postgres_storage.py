"""Dagster's own storage on PostgreSQL, through the project's instance config.

`prepare_home` with `DAGSTER_PG_URL` writes a `dagster.yaml` whose storage block is
dagster-postgres; the test runs a real week of the project's job into that instance, then reads
the run back from PostgreSQL twice: through a freshly opened instance, and with plain SQL on
Dagster's tables, so nothing can come from a cache or a file in DAGSTER_HOME.

The server is the throwaway cluster of `scripts/pg-test-cluster.sh` (`DAGSTER_TEST_PG_URL`);
each test gets its own database on it, created here and dropped afterwards, so reruns against
the same server never see an earlier run's rows.
"""

import multiprocessing
import uuid
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa
from dagster_postgres import PostgresRunStorage, PostgresScheduleStorage

from digest_pipeline.dagster_storage import (
    KEPT,
    OVERFLOW,
    PooledPostgresEventLogStorage,
    PooledPostgresRunStorage,
)
from digest_pipeline.instance import prepare_home
from digest_pipeline.rigs.bootstrap import PROJECT_ROOT
from digest_pipeline.rigs.servers.webserver import ASSETS, JOB, PARTITION, seed_week
from digest_pipeline.settings import InvalidSetting
from digest_pipeline_tests.conftest import require_url
from digest_pipeline_tests.dagster.graph import project
from digest_pipeline_tests.dagster.harness import metadata
from digest_pipeline_tests.weekly_job import materialize_week

pytestmark = pytest.mark.integration


def job_checks() -> set[tuple[str, str]]:
    """(asset, check) of every check the weekly job evaluates, from its definition.

    Which checks exist is pinned in dagster/test_defs_load.py; here each must be stored.
    """
    job = project().resolve_job_def(JOB)
    return {
        (k.asset_key.to_user_string(), k.name) for k in job.asset_layer.asset_graph.asset_check_keys
    }


def _driver(url: sa.URL, driver: str = "psycopg") -> sa.URL:
    return url.set(drivername=f"postgresql+{driver}")


@pytest.fixture
def fresh_database() -> Iterator[sa.URL]:
    """A new, empty database on the test server for this test's Dagster storage, dropped after.

    The URL keeps the plain `postgresql://` scheme of `DAGSTER_TEST_PG_URL`.
    """
    server = sa.make_url(require_url("DAGSTER_TEST_PG_URL"))
    name = f"dagster_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(
        _driver(server.set(database="postgres")),
        isolation_level="AUTOCOMMIT",
        poolclass=sa.NullPool,
    )
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        try:
            yield server.set(database=name)
        finally:
            with admin.connect() as conn:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


@pytest.fixture
def dagster_pg_url(fresh_database: sa.URL) -> str:
    """The fresh database's URL for dagster-postgres, with the psycopg2 driver named.

    dagster-postgres 0.29.27 writes `NOTIFY run_events, :notify_id` with a bound parameter,
    which only psycopg2's client-side binding accepts; SQLAlchemy 2.1 maps a plain
    `postgresql://` to psycopg 3, whose server-side binding makes PostgreSQL reject that
    statement, so every event write (the first one is in `create_run`) fails.
    `test_a_plain_postgresql_url_is_refused_before_anything_runs` keeps that on record.
    """
    return _driver(fresh_database, "psycopg2").render_as_string(hide_password=False)


def test_a_week_run_on_postgres_storage_is_read_back_from_postgres(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dagster_pg_url: str
) -> None:
    for name, value in seed_week(tmp_path / "ledger").items():
        monkeypatch.setenv(name, value)
    # the generated dagster.yaml names the variable (`{env: DAGSTER_PG_URL}`), not its value
    monkeypatch.setenv("DAGSTER_PG_URL", dagster_pg_url)
    home = prepare_home(PROJECT_ROOT, {"DAGSTER_PG_URL": dagster_pg_url}, tmp_path / "home")
    assert dagster_pg_url not in (home / "dagster.yaml").read_text(encoding="utf-8")

    instance = dg.DagsterInstance.from_config(str(home))
    connects: dict[str, int] = {"events": 0, "runs": 0}

    def count(store: str) -> None:
        connects[store] += 1

    try:
        assert isinstance(instance.run_storage, PooledPostgresRunStorage)
        assert isinstance(instance.event_log_storage, PooledPostgresEventLogStorage)
        assert isinstance(instance.schedule_storage, PostgresScheduleStorage)
        for store, engine in (
            ("events", instance.event_log_storage._engine),
            ("runs", instance.run_storage._engine),
        ):
            sa.event.listen(engine, "connect", lambda *_, store=store: count(store))
        result = materialize_week(instance)
    finally:
        instance.dispose()
    assert result.success
    run_id = result.run_id

    # a second instance, opened from the same home: everything below comes from PostgreSQL
    reread = dg.DagsterInstance.from_config(str(home))
    try:
        assert isinstance(reread.run_storage, PostgresRunStorage)
        run = reread.get_run_by_id(run_id)
        assert run is not None
        assert (run.job_name, run.status) == (JOB, dg.DagsterRunStatus.SUCCESS)
        assert run.tags["dagster/partition"] == PARTITION
        runs = reread.get_runs(dg.RunsFilter(tags={"dagster/partition": PARTITION}))
        assert [r.run_id for r in runs] == [run_id]

        for asset in ASSETS:
            records = reread.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[PARTITION]),
                limit=10,
            ).records
            assert [(r.run_id, r.partition_key) for r in records] == [(run_id, PARTITION)], asset
        deliveries = reread.get_latest_materialization_event(dg.AssetKey("digest_deliveries"))
        assert deliveries is not None
        assert deliveries.asset_materialization is not None
        stored = {k: v.value for k, v in deliveries.asset_materialization.metadata.items()}
        expected = metadata(result, "digest_deliveries")
        assert stored["eligible"] == expected["eligible"] > 0
        assert stored["sent"] == expected["sent"] > 0

        for asset, name in sorted(job_checks()):
            history = reread.event_log_storage.get_asset_check_execution_history(
                dg.AssetCheckKey(dg.AssetKey(asset), name), limit=10
            )
            [record] = history
            assert (record.run_id, record.partition) == (run_id, PARTITION), name
            assert record.status.value == "SUCCEEDED", name
            assert record.event is not None
            evaluation = record.event.asset_check_evaluation
            assert evaluation is not None
            assert (evaluation.passed, evaluation.partition) == (True, PARTITION), name
    finally:
        reread.dispose()

    # and with plain SQL on Dagster's tables in that database (through psycopg 3, for a change)
    engine = sa.create_engine(_driver(sa.make_url(dagster_pg_url)), poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text("SELECT run_id, pipeline_name, status, partition FROM runs")
            ).all()
            tag = conn.execute(
                sa.text(
                    "SELECT value FROM run_tags WHERE run_id = :run AND key = 'dagster/partition'"
                ),
                {"run": run_id},
            ).scalar_one()
            materialized = conn.execute(
                sa.text(
                    "SELECT asset_key, partition FROM event_logs"
                    " WHERE run_id = :run AND dagster_event_type = 'ASSET_MATERIALIZATION'"
                ),
                {"run": run_id},
            ).all()
            events = conn.execute(
                sa.text("SELECT count(*) FROM event_logs WHERE run_id = :run"), {"run": run_id}
            ).scalar_one()
            checked = conn.execute(
                sa.text(
                    "SELECT asset_key, check_name, partition, execution_status"
                    " FROM asset_check_executions WHERE run_id = :run"
                ),
                {"run": run_id},
            ).all()
    finally:
        engine.dispose()
    assert [tuple(r) for r in rows] == [(run_id, JOB, "SUCCESS", PARTITION)]
    # the stores reuse their connections: dagster-postgres alone made one for every event
    assert max(connects.values()) <= KEPT + OVERFLOW < events
    assert tag == PARTITION
    assert sorted(tuple(r) for r in materialized) == sorted(
        (dg.AssetKey(a).to_string(), PARTITION) for a in ASSETS
    )
    assert sorted(tuple(r) for r in checked) == sorted(
        (dg.AssetKey(asset).to_string(), name, PARTITION, "SUCCEEDED")
        for asset, name in job_checks()
    )


def test_the_field_form_names_the_psycopg2_driver_and_runs_a_week(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_database: sa.URL
) -> None:
    """DAGSTER_PG_HOST & co., as an operator writes them: the generated scheme makes it work."""
    for name, value in seed_week(tmp_path / "ledger").items():
        monkeypatch.setenv(name, value)
    env = {
        "DAGSTER_PG_HOST": str(fresh_database.host),
        "DAGSTER_PG_PORT": str(fresh_database.port),
        "DAGSTER_PG_DB": str(fresh_database.database),
        "DAGSTER_PG_USERNAME": str(fresh_database.username),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    home = prepare_home(PROJECT_ROOT, env, tmp_path / "home")
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        assert isinstance(instance.run_storage, PostgresRunStorage)
        assert materialize_week(instance).success
    finally:
        instance.dispose()


def test_a_plain_postgresql_url_is_refused_before_anything_runs(
    tmp_path: Path, fresh_database: sa.URL
) -> None:
    """psycopg 3 (what SQLAlchemy 2.1 picks for postgresql://) cannot write Dagster's events."""
    plain = fresh_database.set(drivername="postgresql").render_as_string(hide_password=False)
    with pytest.raises(InvalidSetting, match="psycopg2"):
        prepare_home(PROJECT_ROOT, {"DAGSTER_PG_URL": plain}, tmp_path / "home")
    assert not (tmp_path / "home" / "dagster.yaml").exists()


def _backend_of(
    storage: PooledPostgresEventLogStorage | PooledPostgresRunStorage,
    answer: "multiprocessing.Queue[int]",
) -> None:
    with storage._engine.connect() as conn:
        answer.put(conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one())


@pytest.mark.parametrize("store", [PooledPostgresEventLogStorage, PooledPostgresRunStorage])
def test_a_forked_process_never_uses_a_pooled_connection(
    dagster_pg_url: str, store: type[PooledPostgresEventLogStorage | PooledPostgresRunStorage]
) -> None:
    """A Celery prefork worker inherits the pool: its calls go over a connection of its own."""
    storage = store(dagster_pg_url)
    try:
        answer: multiprocessing.Queue[int] = multiprocessing.Queue()
        _backend_of(storage, answer)
        parent = answer.get(timeout=60)
        child = multiprocessing.get_context("fork").Process(
            target=_backend_of, args=(storage, answer)
        )
        child.start()
        forked = answer.get(timeout=60)
        child.join(timeout=60)
        assert child.exitcode == 0
        _backend_of(storage, answer)
        assert forked != parent
        # and the parent's kept connection is still its own, alive and reused
        assert answer.get(timeout=60) == parent
    finally:
        storage.dispose()


def test_the_webservers_own_pool_replaces_the_stores_pools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dagster_pg_url: str
) -> None:
    """`dagster-webserver` swaps every store's engine for its own; ours are let go first."""
    monkeypatch.setenv("DAGSTER_PG_URL", dagster_pg_url)
    home = prepare_home(PROJECT_ROOT, {"DAGSTER_PG_URL": dagster_pg_url}, tmp_path / "home")
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        stores = [instance.event_log_storage, instance.run_storage]
        pooled = [
            s
            for s in stores
            if isinstance(s, PooledPostgresEventLogStorage | PooledPostgresRunStorage)
        ]
        assert len(pooled) == len(stores)
        ours = [store._engine for store in pooled]
        for engine in ours:
            with engine.connect():
                pass  # each pool now keeps a connection
        instance.optimize_for_webserver(statement_timeout=5000, pool_recycle=3600, max_overflow=5)
        queues = [engine.pool for engine in ours if isinstance(engine.pool, sa.QueuePool)]
        assert len(queues) == len(ours)
        assert all(queue.checkedin() == 0 for queue in queues)
        assert all(store._engine not in ours for store in pooled)
        assert instance.get_runs() == []
    finally:
        instance.dispose()
