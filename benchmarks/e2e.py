"""End to end: one whole period through the real `weekly_digest_job`, as `digest run` runs it.

For each size, ledger backend (SQLite, PostgreSQL) and mailer (a zero-latency in-process one and
the project's outbox), a fresh database is seeded and the job runs once in a fresh process, so
speed, SQL statements per customer and peak memory belong to that run alone.
"""

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import common

MODULE = "benchmarks.e2e"
SIZES = (10_000, 100_000)
LARGE = 1_000_000
BACKENDS = ("sqlite", "postgres")
MAILERS = ("inproc", "outbox")
COLUMNS = (
    "backend",
    "mailer",
    "customers",
    "eligible",
    "wall_s",
    "cust_per_s",
    *(f"{short}_s" for short in common.ASSETS.values()),
    "checks_s",
    "stmts_per_cust",
    "rss_mb",
    "accounted",
    "dup_sends",
    "checks",
    "note",
)


@dataclass(frozen=True)
class Options:
    sizes: Sequence[int] = SIZES
    backends: Sequence[str] = BACKENDS
    mailers: Sequence[str] = MAILERS
    #: a larger size is cut to what fits this budget at the rate the previous size ran
    max_run_seconds: float = 300.0
    json_dir: Path = field(default=common.DEFAULT_JSON_DIR)


def _row(backend: str, mailer: str, m: dict[str, Any]) -> dict[str, Any]:
    assets = m["asset_s"]
    dup = m["mailer_dup_sends"] if m["mailer_dup_sends"] is not None else 0
    return {
        **m,
        "mailer": mailer,
        "cust_per_s": round(m["eligible"] / m["wall_s"], 1),
        **{f"{short}_s": assets.get(short) for short in (*common.ASSETS.values(), "checks")},
        "stmts_per_cust": round(m["statements"] / max(m["eligible"], 1), 1),
        "accounted": "ok" if m["accounted"] else f"FAIL {m['states']}",
        # the outbox cannot hold two files of one key, so there the ledger is the only witness
        "dup_sends": dup + m["ledger_double_sends"],
        "checks": f"{m['checks_passed']}/{m['checks_total']}"
        + (f" FAILED {','.join(m['failed_checks'])}" if m["failed_checks"] else ""),
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


def run(opts: Options) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    last: dict[tuple[str, str], dict[str, Any]] = {}
    for size in opts.sizes:
        for backend in opts.backends:
            for mailer in opts.mailers:
                if backend == "postgres" and not common.pg_available():
                    rows.append(
                        {"backend": backend, "mailer": mailer, "customers": size}
                        | {"note": common.SKIPPED_PG}
                    )
                    continue
                customers = _capped(size, last.get((backend, mailer)), opts.max_run_seconds)
                m = common.measure_in_child(MODULE, backend, customers, mailer=mailer)
                row = _row(backend, mailer, m)
                if customers != size:
                    row["note"] = f"capped from {size:,} (--max-run-seconds)"
                rows.append(row)
                last[(backend, mailer)] = row
    common.print_table(
        "End to end: weekly_digest_job in-process, one fresh process per row; cust_per_s = "
        "eligible / wall; <asset>_s from step events (checks_s: sum of check steps); stmts = "
        "ledger database only; rss_mb = peak RSS of the run's process (it has no children)",
        rows,
        COLUMNS,
    )
    payload = {"rows": rows, "options": {**opts.__dict__, "json_dir": str(opts.json_dir)}}
    common.write_json(opts.json_dir, "e2e", payload)
    return payload


def main(argv: Sequence[str]) -> int:
    if common.child_main(argv, common.measure_job):
        return 0
    p = argparse.ArgumentParser(prog="python -m benchmarks.e2e", description=__doc__)
    p.add_argument("--sizes", type=common.int_list, default=list(SIZES))
    p.add_argument("--large", action="store_true", help=f"also {LARGE:,} customers")
    p.add_argument("--backends", type=common.str_list, default=list(BACKENDS))
    p.add_argument("--mailers", type=common.str_list, default=list(MAILERS))
    p.add_argument("--max-run-seconds", type=float, default=Options.max_run_seconds)
    p.add_argument("--json-dir", type=Path, default=common.DEFAULT_JSON_DIR)
    a = p.parse_args(argv)
    sizes = [*a.sizes, LARGE] if a.large else a.sizes
    run(Options(sizes, a.backends, a.mailers, a.max_run_seconds, a.json_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
