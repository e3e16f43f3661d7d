"""Real Celery workers for the job: a launcher's `digest run` and workers with their own disks.

Each worker is `dagster-celery worker start` (what the README tells operators to run) in its own
folder, with its own `DAGSTER_HOME` and working directory, so nothing but the broker, the
PostgreSQL ledger and the PostgreSQL Dagster storage is shared: as on separate machines. Used by
the Celery integration test and the Celery benchmark rows.
"""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import sqlalchemy as sa

from digest_pipeline.adapters.demo_data import SeedReport, seed_demo
from digest_pipeline.dagster_private import DagsterEventType, InstanceRef
from digest_pipeline.domain.periods import Period
from digest_pipeline.instance import prepare_home
from digest_pipeline.rigs.bootstrap import PROJECT_ROOT, open_rig_ledger
from digest_pipeline.rigs.seeding import T0
from digest_pipeline.rigs.servers.pg_cluster import throwaway_allowance
from digest_pipeline.rigs.servers.provider_server import ProviderServer

BIN = Path(sys.executable).parent
CELERY_YAML = PROJECT_ROOT / "deploy" / "celery.yaml"
#: the engine event's metadata entry naming the worker that ran a step (dagster_celery/tasks.py)
WORKER_ENTRY = "Celery worker"
#: the first week the demo shop seeded at T0 can deliver
SEEDED_WEEK = Period(2026, 42)


def fresh_database(server_url: str, name: str) -> str:
    """Drops and creates database `name` on `server_url`'s server; returns its URL."""
    url = sa.make_url(server_url)
    admin = sa.create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    finally:
        admin.dispose()
    return url.set(database=name).render_as_string(hide_password=False)


def parent_of(pid: int) -> int:
    """The process's parent's pid, from `/proc`; -1 once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    return int(stat.rsplit(")", 1)[1].split()[1])


@dataclass
class Worker:
    """One `dagster-celery worker start` process tree (its own session, so it is killed whole)."""

    name: str
    folder: Path
    process: "subprocess.Popen[bytes]"

    @property
    def log(self) -> str:
        return (self.folder / "worker.log").read_text(errors="replace")

    def pool_pids(self) -> list[int]:
        """The prefork pool's processes, the ones that execute steps.

        The worker's session holds `dagster-celery`, Celery's main process and its pool
        children (and their delivery helpers): a pool child's parent's parent is the session's
        leader, `dagster-celery`.
        """
        parents = self._parents()
        return sorted(p for p, up in parents.items() if parents.get(up) == self.process.pid)

    def helper_pids(self) -> list[int]:
        """The delivery helpers the pool's processes have forked (`DIGEST_DELIVERY_PROCESSES`)."""
        pool = set(self.pool_pids())
        return sorted(p for p, up in self._parents().items() if up in pool)

    def _parents(self) -> dict[int, int]:
        """Each live process of the worker's session, with its parent."""
        found = subprocess.run(
            ["pgrep", "-s", str(self.process.pid)], capture_output=True, text=True, check=False
        ).stdout.split()
        return {int(p): parent_of(int(p)) for p in found}

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)


@dataclass
class CeleryRig:
    """A launcher folder plus workers, all on one broker, one ledger and one Dagster storage."""

    root: Path
    #: the `DIGEST_*` settings of the run (ledger, mailer, executor, broker, …)
    settings: dict[str, str]
    dagster_pg_url: str
    workers: list[Worker] = field(default_factory=list)

    def env(self, folder: Path, drop: tuple[str, ...] = ()) -> dict[str, str]:
        """A process's environment: PATH and the settings, as an operator would give them."""
        env = {
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(folder),
            "LANG": "C.UTF-8",
            "DAGSTER_HOME": str(folder / "dagster_home"),
            "DAGSTER_PG_URL": self.dagster_pg_url,
            **throwaway_allowance(),
            **self.settings,
        }
        for name in drop:
            env.pop(name, None)
        return env

    @property
    def launcher(self) -> Path:
        return self.root / "launcher"

    def start_worker(self, name: str, *, drop: tuple[str, ...] = ()) -> Worker:
        """Starts a worker (one step at a time) in its own folder; returns once it is ready."""
        folder = self.root / name
        folder.mkdir(parents=True, exist_ok=True)
        env = self.env(folder, drop)
        # the worker's own instance folder; `worker start` writes its Celery config there, and
        # each step opens the run's instance (PostgreSQL) from the task
        prepare_home(PROJECT_ROOT, env, folder / "dagster_home")
        with (folder / "worker.log").open("wb") as log:
            process = subprocess.Popen(
                [
                    str(BIN / "dagster-celery"),
                    "worker",
                    "start",
                    "-A",
                    "dagster_celery.app",
                    "-y",
                    str(CELERY_YAML),
                    "-n",
                    name,
                    "--",
                    "--concurrency=1",
                    "--pool=prefork",
                    "--without-gossip",
                    "--without-mingle",
                ],
                cwd=folder,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        worker = Worker(name, folder, process)
        self.workers.append(worker)
        deadline = time.monotonic() + 120
        while " ready." not in worker.log:
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"worker {name} did not start:\n{worker.log[-4000:]}")
            time.sleep(0.2)
        return worker

    def stop_workers(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.workers.clear()

    def digest(self, *args: str) -> "subprocess.Popen[str]":
        """Starts `digest ARGS` as the launcher would (read it with `finished`)."""
        self.launcher.mkdir(parents=True, exist_ok=True)
        return subprocess.Popen(
            [str(BIN / "digest"), *args],
            cwd=PROJECT_ROOT,
            env=self.env(self.launcher),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    @contextmanager
    def instance(self) -> Iterator[dg.DagsterInstance]:
        """The launcher's Dagster instance (PostgreSQL storage), for reading runs and events."""
        previous = os.environ.get("DAGSTER_PG_URL")
        os.environ["DAGSTER_PG_URL"] = self.dagster_pg_url
        try:
            home = self.launcher / "dagster_home"
            with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
                yield instance
        finally:
            if previous is None:
                os.environ.pop("DAGSTER_PG_URL", None)
            else:
                os.environ["DAGSTER_PG_URL"] = previous


def finished(process: "subprocess.Popen[str]", timeout: float = 900) -> tuple[int, str]:
    """Waits for `process`; returns its exit code and its output (stdout then stderr)."""
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out + err


def step_workers(instance: dg.DagsterInstance, run_id: str) -> dict[str, str]:
    """Step key -> the Celery worker (`name@host`) that executed it, from the run's events."""
    found: dict[str, str] = {}
    for record in instance.all_logs(run_id, of_type=DagsterEventType.ENGINE_EVENT):
        event = record.dagster_event
        if event is None or event.step_key is None:
            continue
        entry = event.engine_event_data.metadata.get(WORKER_ENTRY)
        if entry is not None:
            found[event.step_key] = str(entry.value)
    return found


def run_id_of(output: str) -> str:
    """The run id `digest run` printed on its first line ("period …: run <id> …")."""
    first = output.splitlines()[0]
    return first.split(" run ", 1)[1].split()[0]


def seeded_ledger(
    server_url: str, name: str, *, customers: int, seed: int
) -> tuple[str, SeedReport]:
    """A fresh ledger database `name` on `server_url`'s server with the demo shop as of T0.

    Returns its URL and the seed report.
    """
    url = fresh_database(server_url, name)
    with open_rig_ledger(url) as ledger:
        return url, seed_demo(ledger.engine, customers=customers, seed=seed, now=T0)


def provider_settings(
    ledger_url: str, broker_url: str | None, provider: ProviderServer, **extra: str
) -> dict[str, str]:
    """The run's `DIGEST_*` settings: the ledger, the HTTP provider, and Celery on `broker_url`.

    Without a broker the steps run in the launcher's process (the default executor). The
    workers' clocks are real, so the seeded weeks (2026-W42 on) keep their delivery window
    open until a day from now.
    """
    window = datetime.now(UTC) + timedelta(days=1) - SEEDED_WEEK.ends_at
    celery = (
        {"DIGEST_EXECUTOR": "celery", "DIGEST_CELERY_BROKER_URL": broker_url} if broker_url else {}
    )
    return {
        "DIGEST_DATABASE_URL": ledger_url,
        **celery,
        "DIGEST_MAILER": "http",
        "DIGEST_PROVIDER_URL": provider.url,
        "DIGEST_PROVIDER_API_KEY": provider.api_key,
        "DIGEST_DELIVERY_WINDOW_SECONDS": str(int(window.total_seconds())),
        # the seeded weeks are partitions whatever the ledger held when the definitions loaded
        "DIGEST_FIRST_WEEK": str(SEEDED_WEEK),
        **throwaway_allowance(),
        **extra,
    }
