"""Peak memory and time of `generate_content` against the number of customers.

Content generation must stay flat in memory as customers grow, so this seeds N demo customers into
a fresh SQLite file, freezes the period, then runs `generate_content` alone in a fresh
subprocess: its peak RSS is then the content step's own, not the seeding's.

    .venv/bin/python -m benchmarks.content_memory 10000 100000 [--keep DIR]
"""

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from digest_pipeline.adapters.demo_data import seed_demo
from digest_pipeline.adapters.sql.customer_source import SqlCustomerSource
from digest_pipeline.adapters.sql.engine import create_ledger_engine
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.domain.periods import Period
from digest_pipeline.rigs.bootstrap import open_rig_ledger
from digest_pipeline.runtime.executor import executor_for
from digest_pipeline.services.content import generate_content
from digest_pipeline.services.snapshot import take_snapshot

#: a fixed "now", so every run seeds the same rows
NOW = datetime(2026, 10, 21, 12, tzinfo=UTC)
#: the demo data's new arrivals fall in the complete week before `NOW`
PERIOD = Period.of((NOW - timedelta(weeks=1)).date())


class _Clock:
    def now(self) -> datetime:
        return NOW


def seeded(customers: int, directory: Path) -> Path:
    """A SQLite file with the demo data and the period frozen (reused if already there)."""
    path = directory / f"content-{customers}.db"
    if path.exists():
        return path
    partial = path.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    with open_rig_ledger(f"sqlite:///{partial}") as ledger:
        seed_demo(ledger.engine, customers=customers, seed=7, now=NOW)
        take_snapshot(
            SqlCustomerSource(ledger.engine),
            ledger,
            _Clock(),  # type: ignore[arg-type]
            PERIOD,
            "bench",
            executor=executor_for(ledger),
        )
    partial.rename(path)
    return path


def measure(path: str) -> None:
    """Runs in the child: generate content once, print peak RSS (MB) and seconds as JSON."""
    engine = create_ledger_engine(f"sqlite:///{path}")
    started = time.perf_counter()
    report = generate_content(
        SqlCustomerSource(engine),
        ledger := SqlLedger(engine),
        PERIOD,
        executor=executor_for(ledger),
    )
    seconds = time.perf_counter() - started
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(
        json.dumps(
            {
                "peak_mb": round(peak_mb, 1),
                "seconds": round(seconds, 1),
                "customers": report.customers,
                "rows": report.rows,
                "skipped": report.skipped_existing,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("customers", type=int, nargs="*", default=[10_000, 100_000])
    parser.add_argument("--keep", type=Path, help="directory to keep seeded databases in")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--rerun", action="store_true", help="also time a second run (all skipped)")
    args = parser.parse_args()
    if args.measure:
        measure(args.measure)
        return
    directory = args.keep or Path(tempfile.mkdtemp())
    directory.mkdir(parents=True, exist_ok=True)
    for n in args.customers:
        work = directory / f"run-{n}.db"
        shutil.copy(seeded(n, directory), work)
        runs = ["first"] + (["rerun"] if args.rerun else [])
        for run in runs:
            out = subprocess.run(
                [sys.executable, "-m", "benchmarks.content_memory", "--measure", str(work)],
                check=True,
                capture_output=True,
                text=True,
            )
            print(
                json.dumps({"n": n, "run": run, **json.loads(out.stdout.strip().splitlines()[-1])}),
                flush=True,
            )
        work.unlink()
    if args.keep is None:
        shutil.rmtree(directory)


if __name__ == "__main__":
    main()
