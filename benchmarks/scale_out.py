"""Scale-out: the multiprocess executor with 1, 2 and 4 processes on one PostgreSQL ledger.

With a 50 ms mailer the delivery batches are latency-bound, so more step processes should
deliver more per second; whatever the count, the mailer's own key logs and the ledger's attempt
rows must show zero duplicate sends and zero double claims.
"""

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import common, job_run, tables

MODULE = "benchmarks.scale_out"
PROCESSES = (1, 2, 4)
CUSTOMERS = 6_000
LATENCY_MS = 50.0
#: delivery batches per run: several per process even at the highest process count
BATCHES = 16
COLUMNS = (
    "backend",
    "processes",
    "eligible",
    "batch_size",
    "batches",
    "wall_s",
    "delivery_s",
    "sends",
    "sends_per_s",
    "vs_1_process",
    "rss_mb",
    "rss_children_mb",
    "accounted",
    "mailer_dup_sends",
    "ledger_double_sends",
    "ledger_double_claims",
    "checks",
    "note",
)


@dataclass(frozen=True)
class Options:
    processes: Sequence[int] = PROCESSES
    customers: int = CUSTOMERS
    latency_ms: float = LATENCY_MS
    batches: int = BATCHES
    #: the ledger and the Dagster storage; `sqlite` only for a quick local try
    backend: str = "postgres"
    json_dir: Path = field(default=common.DEFAULT_JSON_DIR)


def _measure(opts: Options, processes: int, batch_size: int) -> dict[str, Any]:
    m = job_run.measure_in_child(
        MODULE,
        opts.backend,
        opts.customers,
        mailer="inproc",
        latency_ms=opts.latency_ms,
        executor="multiprocess",
        processes=processes,
        settings={"DIGEST_BATCH_SIZE": str(batch_size)},
    )
    rate = m["sends"] / m["delivery_s"] if m["delivery_s"] else 0.0
    return {
        **m,
        "processes": processes,
        "batch_size": batch_size,
        "sends_per_s": round(rate, 1),
        **tables.verdicts(m),
    }


def run(opts: Options) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    if opts.backend == "postgres" and not common.pg_available():
        rows = [
            {"backend": "postgres", "processes": n, "note": common.SKIPPED_PG}
            for n in opts.processes
        ]
    else:
        batch_size = math.ceil(opts.customers * common.ELIGIBLE_SHARE / opts.batches)
        rows = [_measure(opts, n, batch_size) for n in opts.processes]
        base = next((r["sends_per_s"] for r in rows if r["processes"] == 1), None)
        for r in rows:
            r["vs_1_process"] = round(r["sends_per_s"] / base, 2) if base else None
    tables.print_table(
        f"Scale-out: multiprocess executor, {opts.customers:,} customers, "
        f"{opts.latency_ms:g} ms mailer, {opts.backend} ledger + instance; sends_per_s over the "
        "digest_deliveries phase; rss_children_mb = largest step process; target 2 processes "
        ">= 1.6x",
        rows,
        COLUMNS,
    )
    return tables.publish("scale_out", rows, opts)


def main(argv: Sequence[str]) -> int:
    if common.child_main(argv, job_run.measure_job):
        return 0
    p = argparse.ArgumentParser(prog="python -m benchmarks.scale_out", description=__doc__)
    p.add_argument("--processes", type=tables.int_list, default=list(PROCESSES))
    p.add_argument("--customers", type=int, default=CUSTOMERS)
    p.add_argument("--latency-ms", type=float, default=LATENCY_MS)
    p.add_argument("--batches", type=int, default=BATCHES)
    p.add_argument("--backend", choices=("postgres", "sqlite"), default="postgres")
    p.add_argument("--json-dir", type=Path, default=common.DEFAULT_JSON_DIR)
    a = p.parse_args(argv)
    run(Options(a.processes, a.customers, a.latency_ms, a.batches, a.backend, a.json_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
