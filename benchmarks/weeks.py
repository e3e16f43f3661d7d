"""Consecutive weeks on one ledger: does a week get slower as the ledger's history grows?

A real install runs every week on the same ledger and Dagster storage, so each week's tables
hold every earlier week's items, attempts, audit rows and archived digest rows. The other
benchmarks start from an empty ledger; this one seeds the demo shop once and runs `--weeks`
consecutive periods, oldest first and ending with the latest complete week, each in a fresh
process as `digest run` would (the delivery window widened so the oldest week is still
deliverable). A table per backend, one row a week; then the last week's wall as a multiple of
the first's (`growth`), and how many weeks the ledger still holds as they ended once the last has
run (`still_accounted`: every item accounted for, in the states its own week's run left it).
The demo shop's orders cover the 12 weeks before now: with more `--weeks`, the older weeks pick
from an empty order window and their content step is cheaper, so compare the phases too.
"""

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from benchmarks import common, job_run, tables
from digest_pipeline.domain.periods import Period

MODULE = "benchmarks.weeks"
CUSTOMERS = 20_000
WEEKS = 6
COLUMNS = (
    "backend",
    "week",
    "eligible",
    "wall_s",
    "cust_per_s",
    "content_s",
    "deliveries_s",
    "cleanup_s",
    "checks_s",
    "srv_stmts_per_cust",
    "event_rows",
    *tables.VERDICT_COLUMNS,
)


@dataclass(frozen=True)
class Options:
    customers: int = CUSTOMERS
    weeks: int = WEEKS
    backends: Sequence[str] = ("sqlite", "postgres")
    json_dir: Path = field(default=common.DEFAULT_JSON_DIR)


def periods(latest: Period, weeks: int) -> list[Period]:
    """`weeks` consecutive periods ending with `latest`, oldest first."""
    return [Period.of((latest.starts_at - timedelta(weeks=k)).date()) for k in range(weeks)][::-1]


def _row(backend: str, period: Period, seeded: common.Seeded, m: dict[str, Any]) -> dict[str, Any]:
    asset = m["asset_s"]
    srv = m["server_statements"]
    return {
        **m,
        "backend": backend,
        "week": str(period),
        "eligible": seeded.eligible,
        "cust_per_s": round(seeded.eligible / m["wall_s"], 1),
        "content_s": asset.get("content"),
        "deliveries_s": asset.get("deliveries"),
        "cleanup_s": asset.get("cleanup"),
        "checks_s": asset.get("checks"),
        "srv_stmts_per_cust": None if srv is None else round(srv / max(seeded.eligible, 1), 2),
        **tables.verdicts(m),
    }


def _weeks_on(backend_name: str, opts: Options) -> tuple[list[dict[str, Any]], int]:
    """Each week's row, and how many weeks the ledger still holds as they ended, at the end."""
    now = common.bench_now()
    chosen = periods(common.latest_period(now), opts.weeks)
    # the oldest week's window still open now: its end plus the weeks since, plus a day
    window = now - chosen[0].ends_at + timedelta(days=1)
    settings = {
        "DIGEST_DELIVERY_WINDOW_SECONDS": str(int(window.total_seconds())),
        # the oldest week is a partition whatever the ledger held when the definitions loaded
        "DIGEST_FIRST_WEEK": str(chosen[0]),
    }
    rows: list[dict[str, Any]] = []
    with common.workdir("weeks") as work, common.backend(backend_name, work) as b:
        seeded = common.seed(b.ledger_url, opts.customers, now)
        for period in chosen:
            spec = job_run.JobSpec(
                b.ledger_url,
                b.dagster_pg_url,
                str(work),
                period.partition_key,
                dict(seeded.__dict__),
                settings=settings,
            )
            m = common.run_child(MODULE, spec.to_json(), work)
            common.progress(f"{MODULE} {backend_name} {period}: {m['wall_s']:,.1f} s")
            rows.append(_row(backend_name, period, seeded, m))
        # a later week's run must leave the earlier weeks as they ended: every item accounted
        # for, in the states its own run left it
        kept = 0
        for period, row in zip(chosen, rows, strict=True):
            now_held = common.ledger_verdict(b.ledger_url, period, seeded)
            kept += now_held["accounted"] and now_held["states"] == row["states"]
    return rows, kept


def run(opts: Options) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    growth: list[dict[str, Any]] = []
    for backend in opts.backends:
        if backend == "postgres" and not common.pg_available():
            rows.append({"backend": backend, "week": common.SKIPPED_PG})
            continue
        weeks, kept = _weeks_on(backend, opts)
        rows += weeks
        first, last = weeks[0]["wall_s"], weeks[-1]["wall_s"]
        growth.append(
            {
                "backend": backend,
                "weeks": len(weeks),
                "still_accounted": kept,
                "first_s": first,
                "last_s": last,
                "growth": round(last / first, 2),
            }
        )
    tables.print_table(
        f"Consecutive weeks on one ledger: {opts.customers:,} customers, zero-latency mailer, "
        "in-process job, each week in a fresh process on the same ledger and Dagster storage",
        rows,
        COLUMNS,
    )
    tables.print_table(
        "The last week's wall as a multiple of the first's",
        growth,
        ("backend", "weeks", "still_accounted", "first_s", "last_s", "growth"),
    )
    return tables.publish("weeks", rows, opts, growth=growth)


def main(argv: Sequence[str]) -> int:
    if common.child_main(argv, job_run.measure_job):
        return 0
    p = argparse.ArgumentParser(prog="python -m benchmarks.weeks", description=__doc__)
    p.add_argument("--customers", type=int, default=CUSTOMERS)
    p.add_argument("--weeks", type=int, default=WEEKS)
    p.add_argument("--backends", type=tables.str_list, default=list(Options.backends))
    p.add_argument("--json-dir", type=Path, default=common.DEFAULT_JSON_DIR)
    a = p.parse_args(argv)
    if a.weeks < 1 or a.customers < 1:
        p.error("--weeks and --customers must be at least 1")
    run(Options(a.customers, a.weeks, a.backends, a.json_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
