"""What every benchmark shares: fresh databases and Dagster homes, seeding, one measured job run
in a fresh subprocess, statement counting, resident memory, the ledger's own verdict, and the
table and JSON output.

Each measurement runs in its own process (`python -m benchmarks.<name> --one SPEC`) so its peak
memory is its own and no engine, pool or Dagster instance leaks from one measurement into the
next.
"""

import json
import math
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

import pandas as pd
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


# -- one measured run of the real job (inside a child process) -----------------------------


#: the setting that gives a batch step delivery helper processes (runtime/helpers.py)
DELIVERY_PROCESSES_ENV = "DIGEST_DELIVERY_PROCESSES"


@dataclass(frozen=True)
class JobSpec:
    """One run of `weekly_digest_job`, as a child process receives it (JSON)."""

    ledger_url: str
    dagster_pg_url: str | None
    workdir: str
    partition: str
    seeded: dict[str, int]
    #: `inproc` (the benchmark mailer, `latency_ms` per send) or `outbox` (the project's own)
    mailer: str = "inproc"
    latency_ms: float = 0.0
    #: `in_process` (what `digest run` does) or `multiprocess` (reconstructable job)
    executor: str = "in_process"
    processes: int = 1
    #: multiprocess only: Dagster's `start_method` (None: its default, `spawn`)
    start_method: str | None = None
    #: extra `DIGEST_*` settings for the run, e.g. `DIGEST_BATCH_SIZE`
    settings: dict[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def measure_job(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Runs the job once in this process and reports time, statements, memory and verdicts."""
    import dagster as dg

    from benchmarks import bench_defs
    from digest_pipeline.definitions import defs
    from digest_pipeline.defs.resources import DeliveryResource

    spec = JobSpec(**raw)
    multiprocess = spec.executor == "multiprocess"
    # delivery helper processes (DIGEST_DELIVERY_PROCESSES): their sends are counted in files
    helpers = int((spec.settings or {}).get(DELIVERY_PROCESSES_ENV, "1")) > 1
    work = Path(spec.workdir)
    keys_dir = work / "keys"
    keys_dir.mkdir(parents=True, exist_ok=True)
    home = dagster_home(work, spec.dagster_pg_url)
    outbox = spec.mailer == "outbox"
    variables: dict[str, str | None] = {
        **hermetic(spec.settings or {}),
        "DIGEST_DATABASE_URL": spec.ledger_url,
        "DAGSTER_HOME": str(home),
        "DAGSTER_PG_URL": spec.dagster_pg_url,
        "DIGEST_MAILER": "outbox" if outbox else None,
        "DIGEST_OUTBOX_DIR": str(work / "outbox") if outbox else None,
        bench_defs.LATENCY_ENV: str(spec.latency_ms),
        # only other processes need a file; in one process the mailer's own counter is read
        bench_defs.KEYS_DIR_ENV: str(keys_dir) if multiprocess or helpers else None,
    }
    children_seen = True
    with env(variables):
        batch_size = DeliveryResource().settings().batch_size
        instance = dg.DagsterInstance.from_config(str(home))
        try:
            with (
                StatementCounter(spec.ledger_url) as statements,
                ServerStatements(spec.ledger_url) as server,
                Timer() as timer,
            ):
                if multiprocess:
                    result: Any = dg.execute_job(
                        dg.reconstructable(bench_defs.bench_job),
                        instance=instance,
                        run_config=run_config("multiprocess", spec.processes, spec.start_method),
                        tags={"dagster/partition": spec.partition},
                    )
                else:
                    project = (
                        defs()
                        if outbox
                        else bench_defs.bench_definitions(bench_defs.BenchMailerResource())
                    )
                    result = project.resolve_job_def(bench_defs.JOB).execute_in_process(
                        partition_key=spec.partition,
                        instance=instance,
                        raise_on_error=False,
                        run_config=run_config(),
                    )
            asset_s, steps, batches = step_spans(instance, result.run_id)
            # every entry is a row of Dagster's event log (one INSERT each on PostgreSQL)
            event_rows = len(instance.all_logs(result.run_id))
            checks = result.get_asset_check_evaluations()
        finally:
            instance.dispose()
            if multiprocess and spec.start_method == "forkserver":
                children_seen = reap_forkserver()
    seeded = Seeded(**spec.seeded)
    if outbox:
        sends, dup_sends = len(list((work / "outbox" / "new").glob("*.eml"))), None
    elif multiprocess or helpers:
        sends, dup_sends = key_log_duplicates(keys_dir)
    else:
        counts: Counter[str] = Counter()
        for mailer in bench_defs.OPENED:
            counts.update(mailer.sends)
        sends, dup_sends = sum(counts.values()), sum(1 for n in counts.values() if n > 1)
    return {
        "run_success": bool(result.success),
        "wall_s": round(timer.seconds, 3),
        "asset_s": asset_s,
        "delivery_s": asset_s.get("deliveries"),
        "steps": steps,
        "batches": batches,
        "batch_size": batch_size,
        # this process's listener sees neither step processes' nor helpers' statements
        "statements": None if multiprocess or helpers else statements.count,
        "server_statements": server.count,
        "server_transactions": server.transactions,
        "event_rows": event_rows,
        "checks_passed": sum(1 for c in checks if c.passed),
        "checks_total": len(checks),
        "failed_checks": sorted(c.check_name for c in checks if not c.passed),
        "sends": sends,
        "mailer_dup_sends": dup_sends,
        **ledger_verdict(spec.ledger_url, Period.parse(spec.partition), seeded),
        **peak_rss_mb(),
        **({} if children_seen else {"rss_children_mb": None}),
    }


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


def measure_in_child(
    module: str,
    backend_name: str,
    customers: int,
    **job: Any,
) -> dict[str, Any]:
    """Seeds a fresh database with `customers`, then runs the job once in a fresh child process.

    Returns the child's figures with the backend, the period and the seeded counts added.
    """
    now = bench_now()
    period = latest_period(now)
    with (
        workdir(module.rsplit(".", 1)[-1]) as work,
        backend(backend_name, work) as b,
    ):
        seeded = seed(b.ledger_url, customers, now)
        spec = JobSpec(
            b.ledger_url,
            b.dagster_pg_url,
            str(work),
            period.partition_key,
            dict(seeded.__dict__),
            **job,
        )
        out = run_child(module, spec.to_json(), work)
    progress(f"{module} {backend_name} {customers:,} customers: {out['wall_s']:,.1f} s")
    return {
        "backend": backend_name,
        "period": str(period),
        "customers": customers,
        "eligible": seeded.eligible,
        "invalid": seeded.invalid,
        **out,
    }


# -- output --------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 100 else f"{value:,.2f}"
    return str(value)


def accounted_cell(verdict: Mapping[str, Any]) -> str:
    """`ok`, or the states of a week whose items are not all accounted for (`ledger_verdict`)."""
    return "ok" if verdict["accounted"] else f"FAIL {verdict['states']}"


#: the cells `verdicts` makes, in the order the tables show them
VERDICT_COLUMNS = ("accounted", "dup_sends", "checks")


def sent_twice(m: Mapping[str, Any]) -> int:
    """Duplicate sends: the mailer's count, where it has one, plus the ledger's double sends."""
    return int((m["mailer_dup_sends"] or 0) + m["ledger_double_sends"])


def verdicts(m: Mapping[str, Any]) -> dict[str, Any]:
    """A measured run's verdicts as table cells: every item accounted for, duplicate sends (the
    mailer's count, where it has one, plus the ledger's) and the job's checks passed."""
    failed = m.get("failed_checks") or []
    return {
        "accounted": accounted_cell(m),
        # the outbox cannot hold two files of one key, so there the ledger is the only witness
        "dup_sends": sent_twice(m),
        "checks": f"{m['checks_passed']}/{m['checks_total']}"
        + (f" FAILED {','.join(failed)}" if failed else ""),
    }


def print_table(title: str, rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> None:
    """A titled, right-aligned table of the given columns (missing values shown as `-`)."""
    print(f"\n{title}")
    if not rows:
        print("  (no rows)")
        return
    frame = pd.DataFrame([[_cell(r.get(c)) for c in columns] for r in rows], columns=list(columns))
    print(frame.to_string(index=False))
    sys.stdout.flush()


def write_json(json_dir: Path, name: str, payload: Mapping[str, Any]) -> Path:
    """Writes `<json_dir>/<name>.json`, stamped with the time and the machine's core count."""
    json_dir.mkdir(parents=True, exist_ok=True)
    path = json_dir / f"{name}.json"
    stamped = {"benchmark": name, "at": datetime.now(UTC).isoformat(), "cpus": os.cpu_count()}
    path.write_text(
        json.dumps({**stamped, **payload}, indent=2, sort_keys=True, default=str) + "\n",
        encoding="utf-8",
    )
    return path


def publish(name: str, rows: list[dict[str, Any]], opts: Any, **extra: Any) -> dict[str, Any]:
    """Writes a benchmark's rows, options (a dataclass with `json_dir`) and extras as its JSON."""
    payload = {
        "rows": rows,
        **extra,
        "options": {**vars(opts), "json_dir": str(opts.json_dir)},
    }
    write_json(opts.json_dir, name, payload)
    return payload


def int_list(text: str) -> list[int]:
    """`10000,100000` or `10_000` → [10000, 100000] (for argparse)."""
    return [int(part.replace("_", "")) for part in text.split(",") if part.strip()]


def str_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]
