"""What every benchmark shares: fresh databases and Dagster homes, seeding, one measured job run
in a fresh subprocess, statement counting, resident memory, the ledger's own verdict, and the
table and JSON output.

Each measurement runs in its own process (`python -m benchmarks.<name> --one SPEC`) so its peak
memory is its own and no engine, pool or Dagster instance leaks from one measurement into the
next.
"""

import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy import Engine, event
from sqlalchemy.engine import make_url

from digest_pipeline.adapters.demo_data import SeedReport, seed_demo
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.instance import prepare_home
from digest_pipeline.ports import Clock, Ledger, Mailer
from digest_pipeline.rigs.bootstrap import open_rig_ledger
from digest_pipeline.rigs.seeding import SHOP_LINK_SETTINGS
from digest_pipeline.rigs.servers.pg_cluster import throwaway_allowance
from digest_pipeline.runtime.executor import executor_for
from digest_pipeline.services.deliver import Deliverer
from digest_pipeline.settings import load_settings
from digest_pipeline.wiring import build_composer

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_JSON_DIR = ROOT / ".digest" / "bench"
#: the ledger test database `scripts/pg-test-cluster.sh` exports; its server hosts the benches
PG_URL_ENV = "DIGEST_TEST_DATABASE_URL"
SKIPPED_PG = "skipped (no PostgreSQL)"
#: states an eligible item may legitimately end a demo period in
DONE_STATES = ("sent", "cleaned")
SEED = 7
#: share of demo customers who are eligible (5 % inactive and 10 % not opted in: demo_data.P_*)
ELIGIBLE_SHARE = 0.85


# -- databases, homes, seeding -------------------------------------------------------------


def pg_available() -> bool:
    return bool(os.environ.get(PG_URL_ENV))


@dataclass(frozen=True)
class Backend:
    """Where one measurement keeps its ledger and its Dagster instance."""

    name: str
    ledger_url: str
    #: `postgresql+psycopg2://…` for dagster-postgres; None for Dagster's SQLite default
    dagster_pg_url: str | None


def conninfo(url: str, database: str | None = None) -> str:
    """A SQLAlchemy URL (any PostgreSQL driver) as psycopg's connection string, password kept."""
    parsed = make_url(url).set(drivername="postgresql")
    if database is not None:
        parsed = parsed.set(database=database)
    return parsed.render_as_string(hide_password=False)


def _admin(statement: str, database: str) -> None:
    """`CREATE DATABASE` / `DROP DATABASE` run from the cluster's `postgres` database."""
    with psycopg.connect(conninfo(os.environ[PG_URL_ENV], "postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL(statement).format(sql.Identifier(database)))


@contextmanager
def backend(name: str, workdir: Path) -> Iterator[Backend]:
    """A fresh, empty ledger (and Dagster storage) on `sqlite` or `postgres`; dropped afterwards.

    PostgreSQL databases are created on the cluster behind `DIGEST_TEST_DATABASE_URL` under
    unique names, so measurements never see each other's rows.
    """
    if name == "sqlite":
        yield Backend(name, f"sqlite:///{workdir / 'ledger.db'}", None)
        return
    base = make_url(os.environ[PG_URL_ENV])
    ledger = f"bench_{uuid.uuid4().hex[:10]}"
    dagster = f"{ledger}_dagster"
    for db in (ledger, dagster):
        _admin("CREATE DATABASE {}", db)
    try:
        yield Backend(
            name,
            base.set(database=ledger).render_as_string(hide_password=False),
            base.set(drivername="postgresql+psycopg2", database=dagster).render_as_string(
                hide_password=False
            ),
        )
    finally:
        for db in (ledger, dagster):
            _admin("DROP DATABASE IF EXISTS {} WITH (FORCE)", db)


def dagster_home(workdir: Path, dagster_pg_url: str | None) -> Path:
    """A fresh DAGSTER_HOME from the project's dagster.yaml, on SQLite or dagster-postgres."""
    env = {"DAGSTER_PG_URL": dagster_pg_url} if dagster_pg_url else {}
    return prepare_home(ROOT, env, workdir / "dagster_home")


@contextmanager
def workdir(tag: str) -> Iterator[Path]:
    """A temp folder for one measurement's files (SQLite files, outbox, key logs)."""
    with tempfile.TemporaryDirectory(prefix=f"digest-bench-{tag}-") as d:
        yield Path(d)


def bench_now() -> datetime:
    """The real now: the job's clock is the system clock, so the period must be a recent one."""
    return datetime.now(UTC)


def latest_period(now: datetime) -> Period:
    """The latest complete ISO week before `now`, as `digest run --period latest` picks it."""
    return Period.of((now - timedelta(days=7)).date())


@dataclass(frozen=True)
class Seeded:
    customers: int
    eligible: int
    #: eligible customers whose demo address is malformed: their item legitimately ends `failed`
    invalid: int

    @classmethod
    def of(cls, r: SeedReport) -> "Seeded":
        """What a `seed_demo` report means for a week's account."""
        # the demo's inactive / not-opted-in / invalid groups do not overlap (demo_data.P_*)
        return cls(r.customers, r.customers - r.inactive - r.not_opted_in, r.invalid_addresses)


def seed(url: str, customers: int, now: datetime) -> Seeded:
    """Migrates and seeds the demo shop (not timed by any benchmark)."""
    with open_rig_ledger(url) as ledger:
        return Seeded.of(seed_demo(ledger.engine, customers=customers, seed=SEED, now=now))


def bench_deliverer(
    ledger: Ledger, mailer: Mailer, clock: Clock, policy: DeliveryPolicy
) -> Deliverer:
    """The delivery worker the service-level benchmarks time: the project's composer, seeded jitter."""
    composer = build_composer(load_settings({}, ROOT), clock)
    return Deliverer(
        ledger,
        mailer,
        composer,
        clock,
        policy,
        random.Random(7).random,
        "bench",
        executor_for(ledger),
    )


# -- measuring inside one process ----------------------------------------------------------


class StatementCounter:
    """Counts statements sent to one database, whatever engine sends them.

    Dagster's storage also goes through SQLAlchemy, so the listener is class-level on Engine
    and keeps only the connections whose URL names the ledger's database.
    """

    def __init__(self, ledger_url: str) -> None:
        target = make_url(ledger_url)
        self._key = (target.get_backend_name(), target.host, target.port, target.database)
        self._lock = threading.Lock()
        self.count = 0

    def _on_execute(self, conn: Any, *_: Any) -> None:
        url = conn.engine.url
        if (url.get_backend_name(), url.host, url.port, url.database) == self._key:
            with self._lock:
                self.count += 1

    def __enter__(self) -> "StatementCounter":
        event.listen(Engine, "before_cursor_execute", self._on_execute)
        return self

    def __exit__(self, *exc: object) -> None:
        event.remove(Engine, "before_cursor_execute", self._on_execute)


class ServerStatements:
    """Top-level statements the PostgreSQL server ran in the ledger's database, every process's.

    Read from `pg_stat_statements` (which `scripts/pg-test-cluster.sh` preloads), so one
    executemany of 1,000 rows counts as the statements the server really ran, and step processes
    count too. `count` stays None on SQLite or where the extension is not loaded.
    """

    def __init__(self, ledger_url: str) -> None:
        self._url = make_url(ledger_url)
        self._conninfo = conninfo(ledger_url)
        self.count: int | None = None
        self.transactions: int | None = None
        self._ready = False

    def __enter__(self) -> "ServerStatements":
        if self._url.get_backend_name() != "postgresql":
            return self
        try:
            with psycopg.connect(self._conninfo, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                conn.execute("SELECT pg_stat_statements_reset()")
        except psycopg.Error:
            return self  # not preloaded: no server count
        self._ready = True
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._ready:
            return
        query = """
            SELECT coalesce(sum(calls), 0),
                   coalesce(sum(calls) FILTER (WHERE query ~* '^(BEGIN|COMMIT|ROLLBACK)'), 0)
              FROM pg_stat_statements
             WHERE toplevel AND dbid = (SELECT oid FROM pg_database WHERE datname = %s)
               AND query !~* 'pg_stat_statements'
        """
        with psycopg.connect(self._conninfo, autocommit=True) as conn:
            row = conn.execute(query, (self._url.database,)).fetchone()
        assert row is not None
        self.count, self.transactions = int(row[0]), int(row[1])


def peak_rss_mb() -> dict[str, float]:
    """Peak resident memory of this process and of its largest finished child (Linux: KiB).

    Linux passes a reaped child's peak (the larger of its own and its reaped children's) on to
    its parent, so `rss_children_mb` covers grandchildren too, once every generation is reaped.
    """
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"rss_mb": round(own / 1024, 1), "rss_children_mb": round(children / 1024, 1)}


def run_config(
    executor: str = "in_process", processes: int = 1, start_method: str | None = None
) -> dict[str, Any]:
    """Quiet console (the run's events still go to the instance); optionally multiprocess.

    `start_method` is Dagster's selector (`spawn`, its default, or `forkserver`).
    """
    config: dict[str, Any] = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}
    if executor == "multiprocess":
        multiprocess: dict[str, Any] = {"max_concurrent": processes}
        if start_method is not None:
            multiprocess["start_method"] = {start_method: {}}
        config["execution"] = {"config": {"multiprocess": multiprocess}}
    return config


def reap_forkserver() -> bool:
    """Stops multiprocessing's forkserver, if this process started one, and waits for it.

    Step processes started with `forkserver` are the forkserver's children, not this process's:
    it reaps them, and only once it is reaped itself does this process's `RUSAGE_CHILDREN` peak
    cover them. False if the (private) stop hook is missing, so that peak would miss them.
    """
    from multiprocessing import forkserver

    stop = getattr(getattr(forkserver, "_forkserver", None), "_stop", None)
    if stop is None:
        return False
    stop()
    return True


def step_spans(instance: Any, run_id: str) -> tuple[dict[str, float], int, int]:
    """Seconds per asset (first step start to last step end), from the run's event log.

    A step of checks alone (the deliveries') runs between the assets, so such steps get the sum
    of their own durations instead (key `checks`); the other assets' checks are in their spans.
    Also returns the number of steps and of delivery batch steps.
    """
    import dagster as dg

    kinds = {
        dg.DagsterEventType.STEP_START,
        dg.DagsterEventType.STEP_SUCCESS,
        dg.DagsterEventType.STEP_FAILURE,
    }
    by_step: dict[str, list[float]] = defaultdict(list)
    for record in instance.get_records_for_run(run_id, of_type=kinds, limit=10_000_000).records:
        entry = record.event_log_entry
        by_step[entry.step_key or ""].append(entry.timestamp)
    spans: dict[str, list[float]] = defaultdict(list)
    checks = 0.0
    for step, stamps in by_step.items():
        asset = step.split(".", 1)[0]
        if asset in ASSETS:
            spans[ASSETS[asset]] += stamps
        else:
            checks += max(stamps) - min(stamps)
    seconds = {k: round(max(v) - min(v), 3) for k, v in spans.items()}
    seconds["checks"] = round(checks, 3)
    return seconds, len(by_step), sum(1 for step in by_step if "deliver_batch[" in step)


#: the job's assets in graph order, with the short column names the tables use
ASSETS = {
    "eligibility_snapshot": "snapshot",
    "digest_content": "content",
    "digest_work_items": "items",
    "digest_deliveries": "deliveries",
    "digest_cleanup": "cleanup",
}


def ledger_verdict(url: str, period: Period, seeded: Seeded) -> dict[str, Any]:
    """The ledger's account of the period: states, and keys sent or attempted more than once.

    Every eligible item must be sent or cleaned, except the demo's malformed addresses, which
    must be `failed`. With a mailer that never fails, a key attempted twice was claimed twice.
    """
    with open_rig_ledger(url) as ledger:
        states = {s.value: n for s, n in ledger.state_counts(period).items()}
        tally = ledger.attempt_tally(period)
    double_sent, multi_attempt = tally.keys_sent_twice, tally.keys_attempted_twice
    done = sum(states.get(s, 0) for s in DONE_STATES)
    failed = states.get("failed", 0)
    total = sum(states.values())
    ok = total == seeded.eligible and failed == seeded.invalid and done + failed == total
    return {
        "states": states,
        "items": total,
        "accounted": ok,
        "ledger_double_sends": int(double_sent or 0),
        "ledger_double_claims": int(multi_attempt or 0),
    }


def key_log_duplicates(keys_dir: Path) -> tuple[int, int]:
    """(sends, keys sent more than once) over every process's key file in `keys_dir`."""
    counts: Counter[str] = Counter()
    for path in keys_dir.glob("keys-*.txt"):
        with path.open(encoding="utf-8") as f:
            counts.update(line.strip() for line in f if line.strip())
    return sum(counts.values()), sum(1 for n in counts.values() if n > 1)


# -- subprocess plumbing -------------------------------------------------------------------


def run_child(module: str, spec: Mapping[str, Any], log_dir: Path) -> dict[str, Any]:
    """Runs `python -m <module> --one <spec>` from the repository root; returns its JSON line.

    The child's stderr (Dagster's own output) goes to a file, shown only if the child fails.
    """
    log = log_dir / f"child-{uuid.uuid4().hex[:8]}.log"
    with log.open("w", encoding="utf-8") as err:
        done = subprocess.run(
            [sys.executable, "-m", module, "--one", json.dumps(spec)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            check=False,
        )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = log.read_text(encoding="utf-8")[-3000:]
        raise RuntimeError(f"{module} child exited {done.returncode}; stderr tail:\n{tail}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def child_main(argv: Sequence[str], measure: Any) -> bool:
    """If argv is `--one SPEC`, runs `measure(spec)`, prints its JSON and returns True."""
    if len(argv) == 2 and argv[0] == "--one":
        sys.stdout.write(json.dumps(measure(json.loads(argv[1])), default=str) + "\n")
        return True
    return False


@contextmanager
def env(values: Mapping[str, str | None]) -> Iterator[None]:
    """Sets (or, for None, removes) environment variables for the block."""
    saved = {k: os.environ.get(k) for k in values}
    try:
        _set_env(values)
        yield
    finally:
        _set_env(saved)


def _set_env(values: Mapping[str, str | None]) -> None:
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def progress(line: str) -> None:
    """One line on stderr as each measurement ends; the tables come only when a benchmark ends."""
    sys.stderr.write(f"[bench] {line}\n")
    sys.stderr.flush()


def hermetic(settings: Mapping[str, str]) -> dict[str, str | None]:
    """For `env`: unset the caller's `DIGEST_*` settings (not the test URLs), set `settings`.

    As in the test suite, a measurement sees the defaults plus what it asks for, never a
    stray `DIGEST_BATCH_SIZE` from the shell.
    """
    inherited = [k for k in os.environ if k.startswith("DIGEST_") and "_TEST_" not in k]
    inherited = [k for k in inherited if k not in throwaway_allowance()]
    # bulk-seeded shops are not `digest seed` demo data, so the public default secret is
    # refused, and so are the demo's loopback link and a missing postal address
    private = {"DIGEST_UNSUBSCRIBE_SECRET": "benchmark-private-secret", **SHOP_LINK_SETTINGS}
    return {**dict.fromkeys(inherited), **private, **settings}


class Timer:
    def __enter__(self) -> "Timer":
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start
