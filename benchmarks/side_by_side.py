"""Side by side: one Dagster step per customer (`DIGEST_BATCH_SIZE=1`) against the default batches.

The same period of the same shop runs twice through the real job, each from a fresh database in
a fresh process, so the ratio shows what batching saves in Dagster's per-step orchestration, for
the whole run and for the delivery phase alone.
"""

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import common, job_run, tables
from digest_pipeline.settings import load_settings

MODULE = "benchmarks.side_by_side"
CUSTOMERS = 2_000
COLUMNS = (
    "backend",
    "batch_size",
    "customers",
    "eligible",
    "steps",
    "wall_s",
    "delivery_s",
    "ms_per_cust",
    "delivery_ms_per_cust",
    *tables.VERDICT_COLUMNS,
)


@dataclass(frozen=True)
class Options:
    customers: int = CUSTOMERS
    #: SQLite by default; `--backends sqlite,postgres` adds PostgreSQL (another few minutes)
    backends: Sequence[str] = ("sqlite",)
    json_dir: Path = field(default=common.DEFAULT_JSON_DIR)


def _measure(backend: str, customers: int, batch_size: int | None) -> dict[str, Any]:
    settings = {"DIGEST_BATCH_SIZE": str(batch_size)} if batch_size else {}
    m = job_run.measure_in_child(MODULE, backend, customers, settings=settings)
    default = load_settings({}, common.ROOT).batch_size
    per = 1000 / max(m["eligible"], 1)
    return {
        **m,
        "batch_size": f"{batch_size}" if batch_size else f"default ({default})",
        "ms_per_cust": round(m["wall_s"] * per, 2),
        "delivery_ms_per_cust": round((m["delivery_s"] or 0) * per, 2),
        **tables.verdicts(m),
    }


def run(opts: Options) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    ratios: list[dict[str, Any]] = []
    for backend in opts.backends:
        if backend == "postgres" and not common.pg_available():
            rows.append({"backend": backend, "batch_size": common.SKIPPED_PG})
            continue
        single = _measure(backend, opts.customers, 1)
        batched = _measure(backend, opts.customers, None)
        rows += [single, batched]
        ratios.append(
            {
                "backend": backend,
                "run_ratio": round(single["ms_per_cust"] / batched["ms_per_cust"], 1),
                "delivery_ratio": round(
                    single["delivery_ms_per_cust"] / max(batched["delivery_ms_per_cust"], 1e-9), 1
                ),
            }
        )
    tables.print_table(
        f"Side by side: {opts.customers:,} customers, zero-latency mailer, in-process job; "
        "delivery = first to last step event of digest_deliveries",
        rows,
        COLUMNS,
    )
    tables.print_table(
        "Per-customer ratio, one step per customer / default batches (target >= 50x)",
        ratios,
        ("backend", "run_ratio", "delivery_ratio"),
    )
    return tables.publish("side_by_side", rows, opts, ratios=ratios)


def main(argv: Sequence[str]) -> int:
    if common.child_main(argv, job_run.measure_job):
        return 0
    p = argparse.ArgumentParser(prog="python -m benchmarks.side_by_side", description=__doc__)
    p.add_argument("--customers", type=int, default=CUSTOMERS)
    p.add_argument("--backends", type=tables.str_list, default=list(Options.backends))
    p.add_argument("--json-dir", type=Path, default=common.DEFAULT_JSON_DIR)
    a = p.parse_args(argv)
    run(Options(a.customers, a.backends, a.json_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
