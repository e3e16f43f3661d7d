"""A database error mid-insert carries no customer address to stderr or to Dagster's storage.

A real `digest run` on a PostgreSQL ledger blocks on a table lock while it inserts the week's
snapshot (rows that hold every selected address); the test cancels that backend with
`pg_cancel_backend`, exactly as a statement timeout or an operator's cancel would, then reads
the command's stderr and every byte under DAGSTER_HOME (run storage, event logs) for addresses.
"""

import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import Engine, select, text

from digest_pipeline.adapters.demo_data import seed_demo
from digest_pipeline.adapters.sql.schema import customers
from digest_pipeline_tests.conftest import require_postgres_url, throwaway_allowance

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
PROJECT = Path(__file__).resolve().parents[2]
DIGEST = Path(sys.executable).with_name("digest")
#: how long to wait for the run to reach the locked insert (the wait is bounded, not asserted)
REACH_LOCK_S = 120


def blocked_snapshot_insert(engine: Engine) -> int | None:
    """The pid of a backend waiting on a lock while inserting into eligibility_snapshot."""
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                # the ledger takes a snapshot by COPY on psycopg 3, by INSERT elsewhere
                "AND (query ILIKE 'INSERT INTO eligibility_snapshot%'"
                " OR query ILIKE 'COPY eligibility_snapshot%') LIMIT 1"
            )
        ).scalar_one_or_none()


def test_a_cancelled_snapshot_insert_leaves_no_address_in_stderr_or_dagster(
    sql_engine_factory, tmp_path
):
    url = require_postgres_url()
    engine = sql_engine_factory("postgres")
    seed_demo(engine, customers=40, seed=11, now=datetime.now(UTC))
    with engine.connect() as conn:
        addresses = [a for (a,) in conn.execute(select(customers.c.email)) if "@" in a]
    assert addresses
    home = tmp_path / "dagster_home"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DIGEST_")},
        **throwaway_allowance(),
        "DIGEST_DATABASE_URL": url,
        "DIGEST_OUTBOX_DIR": str(tmp_path / "outbox"),
        "DAGSTER_HOME": str(home),
    }
    locker = engine.connect()
    tx = locker.begin()
    locker.execute(text("LOCK TABLE eligibility_snapshot IN ACCESS EXCLUSIVE MODE"))
    run = subprocess.Popen(
        [str(DIGEST), "run", "--period", "latest"],
        cwd=PROJECT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + REACH_LOCK_S
        pid = None
        while pid is None and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
            pid = blocked_snapshot_insert(engine)
        assert pid is not None, "the run never reached the snapshot insert"
        with engine.connect() as conn:
            assert conn.execute(text("SELECT pg_cancel_backend(:p)"), {"p": pid}).scalar()
        out, err = run.communicate(timeout=REACH_LOCK_S)
    finally:
        tx.rollback()
        locker.close()
        if run.poll() is None:
            run.kill()
            run.communicate()

    assert run.returncode != 0
    # the failure is explained (the statement and the cause), without any parameter
    seen = out + err
    stored = b"".join(p.read_bytes() for p in home.rglob("*") if p.is_file())
    assert b"eligibility_snapshot" in stored or "eligibility_snapshot" in seen
    assert b"QueryCanceled" in stored or "QueryCanceled" in seen
    leaked = [a for a in addresses if a in seen or a.encode() in stored]
    assert leaked == []
