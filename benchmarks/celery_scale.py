"""Celery scale-out: the weekly job's delivery batches on 1 and 2 real `dagster-celery` workers.

Each row gets a fresh PostgreSQL ledger and Dagster storage (`bench_celery_ledger_<n>`,
`bench_celery_dagster_<n>` on the servers of `DIGEST_TEST_DATABASE_URL` and
`DAGSTER_TEST_PG_URL`, dropped and recreated at the row's start and left for inspection), a
flushed Redis broker (`DIGEST_TEST_REDIS_URL`), the demo shop seeded
at the test suite's T0 for period 2026-W42 (delivery window widened to a day from now), the HTTP
provider on loopback answering each request after 50 ms, and that many workers, each one
process (`--concurrency=1`) in its own folder. `digest run --period 2026-W42` is run once as the
launcher would; the run's event log, the provider and the ledger give the figures:

- `wall_s`: the whole `digest run` (launch, every step, the summary);
- `delivery_s`: first `deliver_batch` STEP_START to last `deliver_batch` STEP_SUCCESS;
- `sends`: requests the provider received; `sends_per_s` = sends / delivery_s;
- `step_overhead_s`: the mean, over the batch steps, of
  ``(STEP_SUCCESS time - time of the worker's "Executing steps … in celery worker" event)
  - items_in_batch * 0.05 s / DIGEST_CONCURRENCY``, i.e. what a step costs on a worker beyond
  its sends at full concurrency (Dagster's step process start, code location load, ledger
  claims and writes). `items_in_batch` is the batch's `sent` attempts in the ledger (attempts
  whose `worker` is the step's lease owner `<run_id[:8]>:<mapping key>`): the sends that
  actually waited on the provider;
- `workers_used`: distinct Celery workers that ran batch steps (from the engine events);
- `mailer_dup_sends`: keys the provider stored more than once; `ledger_double_sends`: the
  `no_duplicate_send` invariant's violations.

DIGEST_BATCH_SIZE=250 and DIGEST_CONCURRENCY=4: 250 sends four at a time at 50 ms is ~3 s of
sending per batch, long against a Celery step's fixed cost (a fresh step process that loads
the code location, see `step_overhead_s`), and 3,000 customers (2,556 eligible work items) give
11 batches, enough to keep two single-process workers busy almost to the end (11 batches on
two workers cap the speed-up at 11/6 = 1.83x). Smaller batches would make
the step overhead dominate and hide the second worker; much larger ones would leave too few
batches to share evenly.

Targets: 2 workers >= 1.6x one worker's sends_per_s; zero duplicates (provider and ledger).
Without PostgreSQL (`DIGEST_TEST_DATABASE_URL`, `DAGSTER_TEST_PG_URL`) or Redis
(`DIGEST_TEST_REDIS_URL`) the rows are reported as skipped.

This benchmark runs the rigs' Celery rig and HTTP provider
(`digest_pipeline.rigs.servers.celery_rig`, `digest_pipeline.rigs.servers.provider_server`), as
`benchmarks.chaos` runs the rigs' chaos harness: the same workers the integration test runs.
"""

import argparse
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import common, tables
from digest_pipeline.domain.periods import Period
from digest_pipeline.rigs.bootstrap import open_rig_ledger

MODULE = "benchmarks.celery_scale"
WORKERS = (1, 2)
CUSTOMERS = 3_000
LATENCY_MS = 50.0
BATCH_SIZE = 250
CONCURRENCY = 4
PERIOD = Period(2026, 42)
#: the demo shop's seed (seeded at the rigs' fixed T0, digest_pipeline/rigs/seeding.py)
SEED = 11
DAGSTER_URL_ENV = "DAGSTER_TEST_PG_URL"
REDIS_URL_ENV = "DIGEST_TEST_REDIS_URL"
#: the timeout for one `digest run`
RUN_TIMEOUT_S = 1800.0
COLUMNS = (
    "workers",
    "eligible",
    "batch_size",
    "batches",
    "wall_s",
    "delivery_s",
    "sends",
    "sends_per_s",
    "vs_1_worker",
    "step_overhead_s",
    "workers_used",
    "mailer_dup_sends",
    "ledger_double_sends",
    "note",
)


@dataclass(frozen=True)
class Options:
    workers: Sequence[int] = WORKERS
    customers: int = CUSTOMERS
    latency_ms: float = LATENCY_MS
    batch_size: int = BATCH_SIZE
    concurrency: int = CONCURRENCY
    json_dir: Path = field(default=common.DEFAULT_JSON_DIR)


def _missing() -> str | None:
    """Why the rows are skipped, or None when every service is there."""
    if not common.pg_available() or not os.environ.get(DAGSTER_URL_ENV):
        return common.SKIPPED_PG
    if not os.environ.get(REDIS_URL_ENV):
        return "skipped (no Redis)"
    return None


def _batch_timings(instance: Any, run_id: str) -> dict[str, dict[str, float]]:
    """Per batch step: its STEP_START, worker pickup (engine event) and STEP_SUCCESS times."""
    from dagster import DagsterEventType

    marks: dict[str, dict[str, float]] = {}
    for record in instance.all_logs(run_id):
        event = record.dagster_event
        if event is None or event.step_key is None or ".deliver_batch[" not in event.step_key:
            continue
        mine = marks.setdefault(event.step_key, {})
        kind = event.event_type
        if kind == DagsterEventType.STEP_START:
            mine.setdefault("start", record.timestamp)
        elif kind == DagsterEventType.STEP_SUCCESS:
            mine["success"] = record.timestamp
        elif kind == DagsterEventType.ENGINE_EVENT and "in celery worker" in (event.message or ""):
            # the worker's "Executing steps … in celery worker", as it takes the task
            mine.setdefault("picked", record.timestamp)
    return marks


def _ledger_figures(url: str, run_id: str) -> tuple[int, dict[str, int], int]:
    """Work items of the period, `sent` attempts per lease owner, double-send violations."""
    with open_rig_ledger(url) as ledger:
        items = sum(ledger.state_counts(PERIOD).values())
        per_owner = ledger.sent_by_worker(f"{run_id[:8]}:")
        (double,) = ledger.check_invariants(PERIOD, datetime.now(UTC), names=["no_duplicate_send"])
    return int(items), per_owner, double.violations


def _measure(opts: Options, workers: int, root: Path) -> dict[str, Any]:
    import redis

    from digest_pipeline.rigs.servers.celery_rig import (
        CeleryRig,
        finished,
        fresh_database,
        provider_settings,
        run_id_of,
        seeded_ledger,
        step_workers,
    )
    from digest_pipeline.rigs.servers.provider_server import ProviderServer

    broker = os.environ[REDIS_URL_ENV]
    redis.Redis.from_url(broker).flushdb()
    ledger_url, seeded = seeded_ledger(
        os.environ[common.PG_URL_ENV],
        f"bench_celery_ledger_{workers}",
        customers=opts.customers,
        seed=SEED,
    )
    dagster_url = fresh_database(os.environ[DAGSTER_URL_ENV], f"bench_celery_dagster_{workers}")
    eligible = common.Seeded.of(seeded).eligible
    with ProviderServer(latency_seconds=opts.latency_ms / 1000) as provider:
        settings = provider_settings(
            ledger_url,
            broker,
            provider,
            DIGEST_BATCH_SIZE=str(opts.batch_size),
            DIGEST_CONCURRENCY=str(opts.concurrency),
        )
        rig = CeleryRig(root / f"workers_{workers}", settings, dagster_url)
        try:
            for i in range(workers):
                rig.start_worker(f"w{i + 1}")
            started = time.perf_counter()
            code, output = finished(
                rig.digest("run", "--period", str(PERIOD)), timeout=RUN_TIMEOUT_S
            )
            wall_s = time.perf_counter() - started
        finally:
            rig.stop_workers()
        if code != 0:
            raise RuntimeError(
                f"digest run exited {code} with {workers} workers:\n{output[-4000:]}"
            )
        sends = provider.requests
        stored = provider.stored
    run_id = run_id_of(output)
    with rig.instance() as instance:
        marks = _batch_timings(instance, run_id)
        ran_on = step_workers(instance, run_id)
    items, per_owner, double_sends = _ledger_figures(ledger_url, run_id)
    starts = [m["start"] for m in marks.values() if "start" in m]
    ends = [m["success"] for m in marks.values() if "success" in m]
    delivery_s = max(ends) - min(starts) if starts and ends else None
    overheads = [
        m["success"]
        - m["picked"]
        - per_owner.get(f"{run_id[:8]}:{step.split('[', 1)[1].rstrip(']')}", 0)
        * (opts.latency_ms / 1000)
        / opts.concurrency
        for step, m in marks.items()
        if "success" in m and "picked" in m
    ]
    used = {w for step, w in ran_on.items() if ".deliver_batch[" in step}
    common.progress(f"{MODULE} {workers} worker(s): {wall_s:,.1f} s")
    return {
        "workers": workers,
        "customers": opts.customers,
        "eligible": eligible,
        "work_items": items,
        "batch_size": opts.batch_size,
        "concurrency": opts.concurrency,
        "batches": len(marks),
        "expected_batches": math.ceil(items / opts.batch_size),
        "wall_s": round(wall_s, 2),
        "delivery_s": round(delivery_s, 2) if delivery_s else None,
        "sends": sends,
        "sent_attempts": sum(per_owner.values()),
        "sends_per_s": round(sends / delivery_s, 1) if delivery_s else None,
        "step_overhead_s": round(sum(overheads) / len(overheads), 2) if overheads else None,
        "workers_used": len(used),
        "mailer_dup_sends": sum(1 for v in stored.values() if len(v) > 1),
        "ledger_double_sends": double_sends,
        "run_id": run_id,
    }


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "not met")


def run(opts: Options) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    skipped = _missing()
    if skipped:
        rows = [{"workers": n, "note": skipped} for n in opts.workers]
    else:
        with tempfile.TemporaryDirectory(prefix="digest-bench-celery-") as d:
            rows = [_measure(opts, n, Path(d)) for n in opts.workers]
        base = next((r["sends_per_s"] for r in rows if r["workers"] == 1), None)
        for r in rows:
            r["vs_1_worker"] = round(r["sends_per_s"] / base, 2) if base else None
    tables.print_table(
        f"Celery scale-out: {opts.customers:,} customers, {opts.latency_ms:g} ms HTTP provider, "
        f"batch {opts.batch_size}, concurrency {opts.concurrency}, 1-process workers on Redis + "
        "PostgreSQL; sends_per_s over first batch start to last batch success",
        rows,
        COLUMNS,
    )
    two = next((r for r in rows if r["workers"] == 2 and "vs_1_worker" in r), None)
    speedup = None if two is None or two["vs_1_worker"] is None else two["vs_1_worker"] >= 1.6
    measured = [r for r in rows if "sends" in r]
    no_dups = (
        all(r["mailer_dup_sends"] == 0 and r["ledger_double_sends"] == 0 for r in measured)
        if measured
        else None
    )
    print(f"2 workers >= 1.6x one: {_verdict(speedup)}")
    print(f"zero duplicates: {_verdict(no_dups)}")
    sys.stdout.flush()
    return tables.publish(
        "celery_scale",
        rows,
        opts,
        targets={"two_workers_1_6x": speedup, "zero_duplicates": no_dups},
    )


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__)
    p.add_argument("--workers", type=tables.int_list, default=list(WORKERS))
    p.add_argument("--customers", type=int, default=CUSTOMERS)
    p.add_argument("--latency-ms", type=float, default=LATENCY_MS)
    p.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    p.add_argument("--concurrency", type=int, default=CONCURRENCY)
    p.add_argument("--json-dir", type=Path, default=common.DEFAULT_JSON_DIR)
    a = p.parse_args(argv)
    run(Options(a.workers, a.customers, a.latency_ms, a.batch_size, a.concurrency, a.json_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
