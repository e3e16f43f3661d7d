"""`digest run` with one and with two delivery processes: the operator's own command, timed.

The other end-to-end rows time the job in a bare process; this one runs the `digest` console
script as an operator does, progress line and all, on PostgreSQL (ledger and Dagster storage,
fresh for each row: `bench_run_ledger_<n>`, `bench_run_dagster_<n>`, left for inspection) with
the outbox mailer, for the demo shop seeded at the rigs' T0 (2026-W42, delivery window widened
to a day from now). Each row's memory is read from `/proc/<pid>/smaps_rollup` while it runs:
peak RSS and peak private memory of the `digest` process and of its largest helper (RSS counts
the pages a fork shares with its parent; private memory is what the helper adds). A helper
that ends between two samples (a small week's) shows no memory.

- `wall_s`: `digest run`, start to exit; `messages`: files in the outbox;
- `forked_steps` / `batches`: batch steps that logged `delivered_in_processes` (helpers forked)
  out of all of them;
- `accounted`, `dup_sends`: the ledger's account, as for the end-to-end rows.
"""

import argparse
import os
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks import common, job_run, tables
from digest_pipeline.domain.periods import Period
from digest_pipeline.rigs.servers.celery_rig import parent_of

MODULE = "benchmarks.digest_run"
CUSTOMERS = 20_000
#: delivery processes per row, in order (repeat them to interleave: `--processes 1,2,2,1`)
PROCESSES = (1, 2)
PERIOD = Period(2026, 42)
SEED = 5
DAGSTER_URL_ENV = "DAGSTER_TEST_PG_URL"
RUN_TIMEOUT_S = 1800.0
COLUMNS = (
    "processes",
    "customers",
    "eligible",
    "wall_s",
    "messages",
    "forked_steps",
    "batches",
    "rss_mb",
    "private_mb",
    "helper_rss_mb",
    "helper_private_mb",
    "accounted",
    "dup_sends",
    "note",
)


@dataclass(frozen=True)
class Options:
    processes: Sequence[int] = PROCESSES
    customers: int = CUSTOMERS
    json_dir: Path = field(default=common.DEFAULT_JSON_DIR)


def _memory_mb(pid: int) -> tuple[int, int] | None:
    """(RSS, private) of a live process, in MB, or None once it is gone."""
    found: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("Rss", "Private_Clean", "Private_Dirty"):
                found[name] = int(value.split()[0])
    except (OSError, ValueError):
        return None
    private = found.get("Private_Clean", 0) + found.get("Private_Dirty", 0)
    return found.get("Rss", 0) // 1024, private // 1024


@contextmanager
def _peak_memory(root: int) -> Iterator[dict[str, tuple[int, int]]]:
    """Peak (RSS, private) MB of `root` (key "digest") and of its children (key "helper"),
    sampled every 0.3 s while inside."""
    peaks: dict[str, tuple[int, int]] = defaultdict(lambda: (0, 0))
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.3):
            children = [int(d) for d in os.listdir("/proc") if d.isdigit()]
            for role, pid in [("digest", root)] + [
                ("helper", c) for c in children if parent_of(c) == root
            ]:
                now = _memory_mb(pid)
                if now is not None:
                    rss, private = peaks[role]
                    peaks[role] = (max(rss, now[0]), max(private, now[1]))

    sampler = threading.Thread(target=sample, name="memory-sampler", daemon=True)
    sampler.start()
    try:
        yield peaks
    finally:
        stop.set()
        sampler.join()


def _measure(opts: Options, processes: int, row: int, root: Path) -> dict[str, Any]:
    from digest_pipeline.rigs.seeding import W42
    from digest_pipeline.rigs.servers.celery_rig import (
        CeleryRig,
        finished,
        fresh_database,
        run_id_of,
        seeded_ledger,
    )

    ledger_url, seeded = seeded_ledger(
        os.environ[common.PG_URL_ENV],
        f"bench_run_ledger_{row}",
        customers=opts.customers,
        seed=SEED,
    )
    dagster_url = fresh_database(os.environ[DAGSTER_URL_ENV], f"bench_run_dagster_{row}")
    window = datetime.now(UTC) + timedelta(days=1) - W42.ends_at
    outbox = root / f"outbox_{row}"
    settings = {
        "DIGEST_DATABASE_URL": ledger_url,
        "DIGEST_MAILER": "outbox",
        "DIGEST_OUTBOX_DIR": str(outbox),
        "DIGEST_DELIVERY_WINDOW_SECONDS": str(int(window.total_seconds())),
        # the seeded week is a partition whatever the ledger held when the definitions loaded
        "DIGEST_FIRST_WEEK": str(W42),
        job_run.DELIVERY_PROCESSES_ENV: str(processes),
    }
    rig = CeleryRig(root / f"run_{row}", settings, dagster_url)
    started = time.perf_counter()
    launched = rig.digest("run", "--period", str(PERIOD))
    with _peak_memory(launched.pid) as peaks:
        code, output = finished(launched, timeout=RUN_TIMEOUT_S)
    wall_s = time.perf_counter() - started
    if code != 0:
        raise RuntimeError(
            f"digest run exited {code} with {processes} processes:\n{output[-4000:]}"
        )
    run_id = run_id_of(output)
    with rig.instance() as instance:
        lines = [r.user_message for r in instance.all_logs(run_id)]
    account = common.Seeded.of(seeded)
    verdict = common.ledger_verdict(ledger_url, PERIOD, account)
    common.progress(f"{MODULE} {processes} process(es): {wall_s:,.1f} s")
    digest, helper = peaks["digest"], peaks.get("helper")
    return {
        "processes": processes,
        "customers": opts.customers,
        "eligible": account.eligible,
        "wall_s": round(wall_s, 2),
        "messages": len(list((outbox / "new").glob("*"))),
        "forked_steps": sum(1 for m in lines if m.startswith("event=delivered_in_processes")),
        "batches": sum(
            1
            for m in lines
            if m.startswith('Started execution of step "digest_deliveries.deliver_batch')
        ),
        "rss_mb": digest[0],
        "private_mb": digest[1],
        "helper_rss_mb": helper[0] if helper else None,
        "helper_private_mb": helper[1] if helper else None,
        "accounted": tables.accounted_cell(verdict),
        "dup_sends": verdict["ledger_double_sends"],
        "run_id": run_id,
    }


def run(opts: Options) -> dict[str, Any]:
    if not common.pg_available() or not os.environ.get(DAGSTER_URL_ENV):
        rows = [{"processes": n, "note": common.SKIPPED_PG} for n in opts.processes]
    else:
        with tempfile.TemporaryDirectory(prefix="digest-bench-run-") as d:
            rows = [_measure(opts, n, i, Path(d)) for i, n in enumerate(opts.processes)]
    tables.print_table(
        f"digest run (the console script, progress line and all): {opts.customers:,} customers, "
        "PostgreSQL ledger and Dagster storage, outbox mailer, DIGEST_DELIVERY_PROCESSES per row; "
        "memory = peaks sampled from /proc (private: pages not shared with another process)",
        rows,
        COLUMNS,
    )
    return tables.publish("digest_run", rows, opts)


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__)
    p.add_argument("--processes", type=tables.int_list, default=list(PROCESSES))
    p.add_argument("--customers", type=int, default=CUSTOMERS)
    p.add_argument("--json-dir", type=Path, default=common.DEFAULT_JSON_DIR)
    a = p.parse_args(argv)
    run(Options(a.processes, a.customers, a.json_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
