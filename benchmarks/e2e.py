"""End to end: one whole period through the real `weekly_digest_job`, as `digest run` runs it.

For each size, ledger backend (SQLite, PostgreSQL) and mailer (a zero-latency in-process one and
the project's outbox), a fresh database is seeded and the job runs once in a fresh process, so
speed, SQL statements per customer and peak memory belong to that run alone.

Executor `inproc` runs the steps one after another in one process on one core, as `digest run`
and a UI launch do with the job's default executor (here through `execute_in_process`).
Executor `inproc2` is `inproc` with `DIGEST_DELIVERY_PROCESSES=2`: each delivery batch step
works its items in its own process and one forked helper (PostgreSQL and the zero-latency
mailer only, as multiprocess). Executor `multiprocess` runs the same job with run config
selecting Dagster's multiprocess executor (two step processes from a forkserver, the project's
default batch size) for PostgreSQL and the zero-latency mailer only: a persistent instance, and
the question is whether independent delivery batches use both cores.
"""

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import common, job_run, tables

MODULE = "benchmarks.e2e"
SIZES = (10_000, 100_000)
LARGE = 1_000_000
BACKENDS = ("sqlite", "postgres")
MAILERS = ("inproc", "outbox")
EXECUTORS = ("inproc", "inproc2", "multiprocess")
#: multiprocess: concurrent step processes (this machine's two cores) and how they start
PROCESSES = 2
#: inproc2: the in-process executor, each delivery batch step worked by this many processes
#: (`DIGEST_DELIVERY_PROCESSES`: the step's own and a helper, one a core)
HELPER_PROCESSES = 2
START_METHOD = "forkserver"
FALLBACK_START_METHOD = "spawn"
COLUMNS = (
    "backend",
    "mailer",
    "executor",
    "customers",
    "eligible",
    "batches",
    "wall_s",
    "cust_per_s",
    *(f"{short}_s" for short in common.ASSETS.values()),
    "checks_s",
    "stmts_per_cust",
    "srv_stmts_per_cust",
    "event_rows",
    "rss_mb",
    "rss_children_mb",
    *tables.VERDICT_COLUMNS,
    "note",
)


@dataclass(frozen=True)
class Options:
    sizes: Sequence[int] = SIZES
    backends: Sequence[str] = BACKENDS
    mailers: Sequence[str] = MAILERS
    #: `multiprocess` rows only for (postgres, inproc mailer)
    executors: Sequence[str] = EXECUTORS
    #: a larger size is cut to what fits this budget at the rate the previous size ran
    max_run_seconds: float = 300.0
    json_dir: Path = field(default=common.DEFAULT_JSON_DIR)


def _row(backend: str, mailer: str, executor: str, m: dict[str, Any]) -> dict[str, Any]:
    assets = m["asset_s"]
    statements = m["statements"]
    return {
        **m,
        "mailer": mailer,
        "executor": executor,
        "cust_per_s": round(m["eligible"] / m["wall_s"], 1),
        **{f"{short}_s": assets.get(short) for short in (*common.ASSETS.values(), "checks")},
        # None for multiprocess: the step processes' statements are not counted
        "stmts_per_cust": (
            None if statements is None else round(statements / max(m["eligible"], 1), 1)
        ),
        # PostgreSQL only: what the server ran (pg_stat_statements), BEGIN/COMMIT included
        "srv_stmts_per_cust": (
            None
            if m["server_statements"] is None
            else round(m["server_statements"] / max(m["eligible"], 1), 2)
        ),
        # an in-process run has no children; multiprocess: the largest step process;
        # inproc2: the largest delivery helper
        "rss_children_mb": m["rss_children_mb"] if executor != "inproc" else None,
        **tables.verdicts(m),
    }


def _capped(size: int, previous: dict[str, Any] | None, budget: float) -> int:
    """`size`, or the largest round size the previous run's rate finishes within `budget`."""
    if previous is None or previous["wall_s"] <= 0:
        return size
    per_customer = float(previous["wall_s"]) / int(previous["customers"])
    if size * per_customer <= budget:
        return size
    step = int(10 ** max(3, int(math.log10(budget / per_customer)) - 1))
    return max(int(previous["customers"]), int(budget / per_customer) // step * step)


def _variants(opts: Options) -> list[tuple[str, str, str]]:
    """(backend, mailer, executor) per size: multiprocess only for postgres + inproc mailer."""
    return [
        (backend, mailer, executor)
        for executor in opts.executors
        for backend in opts.backends
        for mailer in opts.mailers
        if executor == "inproc" or (backend, mailer) == ("postgres", "inproc")
    ]


def _measure(backend: str, mailer: str, executor: str, customers: int) -> dict[str, Any]:
    """One row's run; multiprocess starts steps from a forkserver, or with spawn if that fails."""
    if executor == "inproc":
        m = job_run.measure_in_child(MODULE, backend, customers, mailer=mailer)
        return _row(backend, mailer, executor, m)
    if executor == "inproc2":
        settings = {job_run.DELIVERY_PROCESSES_ENV: str(HELPER_PROCESSES)}
        m = job_run.measure_in_child(MODULE, backend, customers, mailer=mailer, settings=settings)
        return _row(backend, mailer, executor, m)
    note = None
    for start in (START_METHOD, FALLBACK_START_METHOD):
        try:
            m = job_run.measure_in_child(
                MODULE,
                backend,
                customers,
                mailer=mailer,
                executor="multiprocess",
                processes=PROCESSES,
                start_method=start,
            )
        except RuntimeError as e:
            if start == FALLBACK_START_METHOD:
                raise
            cause = str(e).strip().splitlines()[-1][:120]
            note = f"{start} failed ({cause}); {FALLBACK_START_METHOD}"
            common.progress(f"{MODULE}: {note}")
            continue
        row = _row(backend, mailer, executor, m)
        row["start_method"] = start
        if note:
            row["note"] = note
        if m["rss_children_mb"] is None:
            row["note"] = ((note + "; ") if note else "") + "step processes' peak RSS not seen"
        return row
    raise AssertionError("unreachable")


def run(opts: Options) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    last: dict[tuple[str, str, str], dict[str, Any]] = {}
    for size in opts.sizes:
        for backend, mailer, executor in _variants(opts):
            if backend == "postgres" and not common.pg_available():
                rows.append(
                    {"backend": backend, "mailer": mailer, "executor": executor}
                    | {"customers": size, "note": common.SKIPPED_PG}
                )
                continue
            key = (backend, mailer, executor)
            customers = _capped(size, last.get(key), opts.max_run_seconds)
            row = _measure(backend, mailer, executor, customers)
            if customers != size:
                note = f"capped from {size:,} (--max-run-seconds)"
                row["note"] = f"{row['note']}; {note}" if row.get("note") else note
            rows.append(row)
            last[key] = row
    tables.print_table(
        "End to end: weekly_digest_job, one fresh process per row; executor inproc = "
        "execute_in_process (one process), inproc2 = the same with "
        f"DIGEST_DELIVERY_PROCESSES={HELPER_PROCESSES} (stmts and rss_children_mb as for "
        "multiprocess, of its helpers), multiprocess = execute_job with "
        f"{PROCESSES} step processes ({START_METHOD}); cust_per_s = eligible / wall; <asset>_s "
        "from step events (checks_s: the deliveries' step of checks, the other checks being in "
        "their assets' steps; multiprocess deliveries_s includes its batch steps' process "
        "start-up); stmts = ledger database only, "
        "in-process rows only ('-' for multiprocess: the step processes' statements are not "
        "counted); rss_mb = peak RSS of the run's process, rss_children_mb = of the largest "
        "step process",
        rows,
        COLUMNS,
    )
    return tables.publish("e2e", rows, opts)


def main(argv: Sequence[str]) -> int:
    if common.child_main(argv, job_run.measure_job):
        return 0
    p = argparse.ArgumentParser(prog="python -m benchmarks.e2e", description=__doc__)
    p.add_argument("--sizes", type=tables.int_list, default=list(SIZES))
    p.add_argument("--large", action="store_true", help=f"also {LARGE:,} customers")
    p.add_argument("--backends", type=tables.str_list, default=list(BACKENDS))
    p.add_argument("--mailers", type=tables.str_list, default=list(MAILERS))
    p.add_argument(
        "--executors",
        type=tables.str_list,
        default=list(EXECUTORS),
        help="inproc, multiprocess (the latter only for postgres + inproc mailer)",
    )
    p.add_argument("--max-run-seconds", type=float, default=Options.max_run_seconds)
    p.add_argument("--json-dir", type=Path, default=common.DEFAULT_JSON_DIR)
    a = p.parse_args(argv)
    sizes = [*a.sizes, LARGE] if a.large else a.sizes
    run(Options(sizes, a.backends, a.mailers, a.executors, a.max_run_seconds, a.json_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
