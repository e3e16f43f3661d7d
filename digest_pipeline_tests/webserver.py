"""One real week for the instance-storage tests, and the real Dagster webserver on loopback.

`seed_week` seeds demo source data into a fresh SQLite ledger and returns the `DIGEST_*`
environment that points the project's resources at it; `materialize_week` runs the project's
own `weekly_digest_job` for partition `2026-10-12` (2026-W42) into a given instance. The
PostgreSQL storage test and the webserver GraphQL test both use them, and the webserver
subprocess gets the same environment, so it sees the same ledger and outbox.

`running_webserver` starts `dagster-webserver` on 127.0.0.1 with the project's `workspace.yaml`,
waits until it answers, and always stops it (and the code server it spawned) afterwards.
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import httpx

from digest_pipeline.adapters.demo_data import seed_demo
from digest_pipeline.adapters.sql_engine import create_ledger_engine
from digest_pipeline.definitions import defs
from digest_pipeline_tests.conftest import T0, W42

#: the repository root: `dagster.yaml`, `workspace.yaml` and the package live here
PROJECT_ROOT = Path(__file__).resolve().parents[1]
PARTITION = W42.partition_key  # "2026-10-12"
JOB = "weekly_digest_job"
ASSETS = (
    "eligibility_snapshot",
    "digest_content",
    "digest_work_items",
    "digest_deliveries",
    "digest_cleanup",
)
CUSTOMERS = 30
SEED = 3
#: the venv's console script, next to the interpreter running the tests
WEBSERVER = Path(sys.executable).with_name("dagster-webserver")


def seed_week(folder: Path) -> dict[str, str]:
    """Seeds 2026-W42's source data into `folder/ledger.db`; returns the run's `DIGEST_*` env."""
    folder.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{folder / 'ledger.db'}"
    engine = create_ledger_engine(url)
    try:
        # as of Monday 06:00 after W42: orders in the weeks before, new arrivals inside W42
        seed_demo(engine, customers=CUSTOMERS, seed=SEED, now=T0)
    finally:
        engine.dispose()
    # The resources run on the real clock (SystemClock), and by default the delivery window of
    # a week closes three days after it ends, so a run of this fixed, past week today would
    # dead-letter every item `window_closed`. Keep W42's window open until a day after now,
    # rather than running "the latest week": that keeps the partition key and the seeded data
    # the same whatever day the test runs on.
    window = datetime.now(UTC) + timedelta(days=1) - W42.ends_at
    return {
        "DIGEST_DATABASE_URL": url,
        "DIGEST_OUTBOX_DIR": str(folder / "outbox"),
        "DIGEST_MAILER": "outbox",
        "DIGEST_DELIVERY_WINDOW_SECONDS": str(int(window.total_seconds())),
    }


def materialize_week(instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    """Runs the project's weekly job for 2026-W42 into `instance` (the `DIGEST_*` env is set)."""
    job = defs().resolve_job_def(JOB)
    return job.execute_in_process(partition_key=PARTITION, instance=instance)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Webserver:
    """A running webserver: its base URL and a client for the UI's GraphQL endpoint."""

    url: str
    client: httpx.Client

    def graphql(self, query: str, variables: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """POSTs one query to `/graphql`; returns `data`, failing on any GraphQL error."""
        response = self.client.post(
            f"{self.url}/graphql", json={"query": query, "variables": dict(variables or {})}
        )
        response.raise_for_status()
        body = response.json()
        assert not body.get("errors"), body["errors"]
        data: dict[str, Any] = body["data"]
        return data


class WebserverDied(RuntimeError):
    """The webserver exited (or never answered) before it was up."""


def _log_tail(path: Path, limit: int = 6000) -> str:
    text = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
    return text[-limit:]


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member we may not signal still exists
        return True
    return True


def _stop(proc: "subprocess.Popen[bytes]", timeout: float) -> None:
    """SIGTERM the webserver, then SIGKILL its process group (it and its code server) if needed.

    The group is the one `start_new_session` made for this webserver alone.
    """
    pgid = proc.pid
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            proc.wait(timeout=timeout)
    # The code server notices its parent is gone and exits by itself; give it a moment.
    deadline = time.monotonic() + timeout
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _group_alive(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


def _wait_until_up(
    proc: "subprocess.Popen[bytes]", client: httpx.Client, url: str, log: Path, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise WebserverDied(
                f"dagster-webserver exited with {proc.returncode} before it was up:\n"
                + _log_tail(log)
            )
        try:
            if client.get(f"{url}/server_info", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise WebserverDied(f"dagster-webserver did not answer within {timeout} s:\n" + _log_tail(log))


@contextlib.contextmanager
def running_webserver(
    env: Mapping[str, str], logs: Path, *, startup_timeout: float = 60, stop_timeout: float = 10
) -> Iterator[Webserver]:
    """Runs `dagster-webserver -w workspace.yaml --read-only` on a free loopback port.

    `env` is the whole environment of the server (DAGSTER_HOME and `DIGEST_*` included); its
    stdout and stderr go to `logs/webserver.log`, which a start-up failure quotes.
    """
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / "webserver.log"
    for attempt in range(3):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with log.open("wb") as out, httpx.Client(timeout=30) as client:
            proc = subprocess.Popen(
                [
                    str(WEBSERVER),
                    *("-h", "127.0.0.1", "-p", str(port)),
                    *("-w", str(PROJECT_ROOT / "workspace.yaml")),
                    "--read-only",
                ],
                cwd=PROJECT_ROOT,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                try:
                    _wait_until_up(proc, client, url, log, startup_timeout)
                except WebserverDied:
                    # another process may have taken the port between the probe and the bind
                    if attempt < 2 and "address already in use" in _log_tail(log).lower():
                        continue
                    raise
                yield Webserver(url, client)
                return
            finally:
                _stop(proc, stop_timeout)
    raise AssertionError("unreachable")  # pragma: no cover
