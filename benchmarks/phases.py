"""A week's phases one by one, through the services alone: wall, the worker's CPU, and the SQL.

Each phase (snapshot, content, work items, deliveries, cleanup) is timed on its own, on a fresh
database, with no Dagster around it: the wall clock, the process's CPU time (so `cpu / wall` says
how much of the phase the worker's own Python was, and the rest waiting on the database), and
the ledger's statements by the time the worker waited for each (SQLAlchemy's cursor events, the
server's execution and the round trip; a COPY goes past them). Where the end-to-end
benchmark says how long a week takes, this says where a phase's time goes.
"""

import argparse
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event

from benchmarks import common, tables
from benchmarks.bench_mailer import BenchMailer
from digest_pipeline.adapters.clock import SystemClock
from digest_pipeline.adapters.sql.customer_source import SqlCustomerSource
from digest_pipeline.adapters.sql.engine import create_ledger_engine
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.component.resources import DeliveryResource
from digest_pipeline.services.cleanup import clean_period
from digest_pipeline.services.content import generate_content
from digest_pipeline.services.deliver import deliver_due
from digest_pipeline.services.enqueue import enqueue_period
from digest_pipeline.services.snapshot import take_snapshot
from digest_pipeline.settings import DEFAULT_CONCURRENCY

MODULE = "benchmarks.phases"
CUSTOMERS = 40_000
#: statements shown per phase, the longest waits first
TOP = 5
PHASE_COLUMNS = (
    "backend",
    "phase",
    "items",
    "wall_s",
    "cpu_s",
    "cpu_share",
    "wall_ms_per_item",
    "accounted",
)
STATEMENT_COLUMNS = ("backend", "phase", "statement", "calls", "wait_s", "ms_per_call")


@dataclass(frozen=True)
class Options:
    customers: int = CUSTOMERS
    backends: Sequence[str] = ("postgres",)
    #: DIGEST_CONCURRENCY for the delivery phase (the outbox's default)
    concurrency: int = DEFAULT_CONCURRENCY["outbox"]
    latency_ms: float = 0.0
    json_dir: Path = field(default=common.DEFAULT_JSON_DIR)


class _Waits:
    """The time the worker waited on each statement, by its first words, per phase."""

    def __init__(self, engine: Engine) -> None:
        self.phase = ""
        self.by: defaultdict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
        event.listen(engine, "before_cursor_execute", self._before)
        event.listen(engine, "after_cursor_execute", self._after)

    def _before(self, conn: Any, *_: Any) -> None:
        conn.info["bench_t0"] = time.perf_counter()

    def _after(self, conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        tally = self.by[(self.phase, " ".join(statement.split())[:60])]
        tally[0] += 1
        tally[1] += time.perf_counter() - conn.info.pop("bench_t0")

    def top(self, backend: str, phase: str) -> list[dict[str, Any]]:
        mine = [(s, n, t) for (p, s), (n, t) in self.by.items() if p == phase]
        mine.sort(key=lambda x: -x[2])
        return [
            {
                "backend": backend,
                "phase": phase,
                "statement": s,
                "calls": int(n),
                "wait_s": round(t, 3),
                "ms_per_call": round(1000 * t / n, 2),
            }
            for s, n, t in mine[:TOP]
        ]


@contextmanager
def _timed(rows: list[dict[str, Any]], backend: str, phase: str, waits: _Waits) -> Iterator[None]:
    waits.phase = phase
    cpu, wall = time.process_time(), time.perf_counter()
    yield
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    rows.append({"backend": backend, "phase": phase, "wall_s": wall, "cpu_s": cpu})


def _week(backend: str, opts: Options) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    now = common.bench_now()
    period = common.latest_period(now)
    phases: list[dict[str, Any]] = []
    with common.workdir("phases") as work, common.backend(backend, work) as b:
        seeded = common.seed(b.ledger_url, opts.customers, now)
        settings = {"DIGEST_CONCURRENCY": str(opts.concurrency)}
        with common.env(common.hermetic(settings)):
            engine = create_ledger_engine(b.ledger_url)
            waits = _Waits(engine)
            ledger, clock = SqlLedger(engine), SystemClock()
            source = SqlCustomerSource(engine)
            delivery = DeliveryResource().settings()
            deliverer = common.bench_deliverer(
                ledger, BenchMailer(opts.latency_ms), clock, delivery.policy
            )
            run = deliverer.executor
            steps: list[tuple[str, Callable[[], Any]]] = [
                (
                    "snapshot",
                    lambda: take_snapshot(source, ledger, clock, period, "bench", executor=run),
                ),
                ("content", lambda: generate_content(source, ledger, period, executor=run)),
                ("work items", lambda: enqueue_period(ledger, clock, period)),
                (
                    "deliveries",
                    lambda: deliver_due(
                        deliverer,
                        batch_size=delivery.claim_size,
                        concurrency=opts.concurrency,
                        period=period,
                    ),
                ),
                (
                    "cleanup",
                    lambda: clean_period(
                        ledger, clock, period, delivery.cleanup_mode, executor=run
                    ),
                ),
            ]
            try:
                for phase, step in steps:
                    with _timed(phases, backend, phase, waits):
                        step()
            finally:
                engine.dispose()
        verdict = common.ledger_verdict(b.ledger_url, period, seeded)
    accounted = tables.accounted_cell(verdict)
    eligible = seeded.eligible
    for row in phases:
        row["items"] = eligible
        row["accounted"] = accounted
        row["cpu_share"] = f"{100 * row['cpu_s'] / row['wall_s']:.0f} %"
        row["wall_ms_per_item"] = round(1000 * row["wall_s"] / max(eligible, 1), 3)
    statements = [s for row in phases for s in waits.top(backend, row["phase"])]
    return phases, statements


def run(opts: Options) -> dict[str, Any]:
    phases: list[dict[str, Any]] = []
    statements: list[dict[str, Any]] = []
    for backend in opts.backends:
        if backend == "postgres" and not common.pg_available():
            common.progress(f"{MODULE}: no PostgreSQL (DIGEST_TEST_DATABASE_URL), skipped")
            continue
        p, s = _week(backend, opts)
        phases += p
        statements += s
    tables.print_table(
        f"A week's phases through the services alone, {opts.customers:,} customers, "
        f"concurrency {opts.concurrency}, {opts.latency_ms:g} ms a send; cpu_share = the "
        "worker's CPU over the wall clock (the rest is waiting, mostly on the database)",
        phases,
        PHASE_COLUMNS,
    )
    tables.print_table(
        f"The statements each phase waited on longest (top {TOP}; a COPY is not counted)",
        statements,
        STATEMENT_COLUMNS,
    )
    return tables.publish("phases", phases, opts, statements=statements)


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__)
    p.add_argument("--customers", type=int, default=CUSTOMERS)
    p.add_argument("--backends", type=tables.str_list, default=["postgres"])
    p.add_argument("--concurrency", type=int, default=Options.concurrency)
    p.add_argument("--latency-ms", type=float, default=0.0)
    p.add_argument("--json-dir", type=Path, default=common.DEFAULT_JSON_DIR)
    a = p.parse_args(argv)
    run(Options(a.customers, a.backends, a.concurrency, a.latency_ms, a.json_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
