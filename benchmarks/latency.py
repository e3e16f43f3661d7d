"""Latency-bound delivery: a mailer that takes 50 ms per send, at concurrency 16, 64 and 256.

With the provider as the bottleneck a worker cannot beat `concurrency / latency` sends per second;
this measures how close the deliver service gets to that bound (and, unless `--no-job`, the same
through the real job's `digest_deliveries`), each level on a fresh database.
"""

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import common, job_run, tables
from benchmarks.bench_mailer import BenchMailer
from digest_pipeline.adapters.clock import SystemClock
from digest_pipeline.adapters.sql.customer_source import SqlCustomerSource
from digest_pipeline.adapters.sql.engine import create_ledger_engine
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.component.resources import DeliveryResource
from digest_pipeline.domain.periods import Period
from digest_pipeline.runtime.executor import executor_for
from digest_pipeline.services.content import generate_content
from digest_pipeline.services.deliver import deliver_due
from digest_pipeline.services.enqueue import enqueue_period
from digest_pipeline.services.snapshot import take_snapshot

MODULE = "benchmarks.latency"
CONCURRENCY = (16, 64, 256)
LATENCY_MS = 50.0
MIN_ITEMS = 2_000
#: items per concurrency slot, so the pool turns over many times per level
ITEMS_PER_SLOT = 25
COLUMNS = (
    "backend",
    "concurrency",
    "latency_ms",
    "batch",
    "items",
    "sends",
    "deliver_s",
    "sends_per_s",
    "bound_per_s",
    "pct_of_bound",
    "job_delivery_s",
    "job_sends_per_s",
    "job_pct_of_bound",
    "accounted",
    "dup_sends",
)


@dataclass(frozen=True)
class Options:
    concurrency: Sequence[int] = CONCURRENCY
    latency_ms: float = LATENCY_MS
    min_items: int = MIN_ITEMS
    #: also run the real job's deliveries at each level (a fresh database and process each)
    with_job: bool = True
    json_dir: Path = field(default=common.DEFAULT_JSON_DIR)


def _service(backend: str, customers: int, concurrency: int, latency_ms: float) -> dict[str, Any]:
    """Seeds, prepares the period through the services, then times `deliver_due` alone."""
    now = common.bench_now()
    period = common.latest_period(now)
    with common.workdir("latency") as work, common.backend(backend, work) as b:
        seeded = common.seed(b.ledger_url, customers, now)
        with common.env(common.hermetic({"DIGEST_CONCURRENCY": str(concurrency)})):
            figures = _deliver(b.ledger_url, period, concurrency, latency_ms)
        verdict = common.ledger_verdict(b.ledger_url, period, seeded)
    common.progress(f"{MODULE} deliver_due at concurrency {concurrency}: {figures['deliver_s']} s")
    return {"eligible": seeded.eligible, "invalid": seeded.invalid, **figures, **verdict}


def _deliver(url: str, period: Period, concurrency: int, latency_ms: float) -> dict[str, Any]:
    engine = create_ledger_engine(url)
    try:
        ledger, source, clock = SqlLedger(engine), SqlCustomerSource(engine), SystemClock()
        take_snapshot(source, ledger, clock, period, "bench-latency", executor=executor_for(ledger))
        generate_content(source, ledger, period, executor=executor_for(ledger))
        enqueue_period(ledger, clock, period)
        # the same settings, and the same claim size, as the job's delivery steps use
        delivery = DeliveryResource().settings()
        mailer = BenchMailer(latency_ms)
        deliverer = common.bench_deliverer(ledger, mailer, clock, delivery.policy)
        with common.Timer() as t:
            report = deliver_due(
                deliverer,
                batch_size=delivery.claim_size,
                concurrency=concurrency,
                period=period,
            )
    finally:
        engine.dispose()
    sends = sum(mailer.sends.values())
    return {
        "batch": delivery.claim_size,
        "claimed": report.claimed,
        "sends": sends,
        "deliver_s": round(t.seconds, 3),
        "sends_per_s": round(sends / t.seconds, 1),
        "mailer_dup_sends": sum(1 for n in mailer.sends.values() if n > 1),
    }


def _level(backend: str, concurrency: int, opts: Options) -> dict[str, Any]:
    items = max(opts.min_items, ITEMS_PER_SLOT * concurrency)
    customers = math.ceil(items / common.ELIGIBLE_SHARE)
    bound = concurrency / (opts.latency_ms / 1000)
    s = _service(backend, customers, concurrency, opts.latency_ms)
    row: dict[str, Any] = {
        **s,
        "backend": backend,
        "concurrency": concurrency,
        "latency_ms": opts.latency_ms,
        "items": s["eligible"],
        "bound_per_s": round(bound, 1),
        "pct_of_bound": round(100 * s["sends_per_s"] / bound, 1),
        "accounted": tables.accounted_cell(s),
        "dup_sends": s["mailer_dup_sends"] + s["ledger_double_sends"],
    }
    if opts.with_job:
        j = job_run.measure_in_child(
            MODULE,
            backend,
            customers,
            latency_ms=opts.latency_ms,
            settings={"DIGEST_CONCURRENCY": str(concurrency)},
        )
        rate = j["sends"] / j["delivery_s"] if j["delivery_s"] else 0.0
        row["job"] = j
        row["job_delivery_s"] = j["delivery_s"]
        row["job_sends_per_s"] = round(rate, 1)
        row["job_pct_of_bound"] = round(100 * rate / bound, 1)
        row["dup_sends"] += (j["mailer_dup_sends"] or 0) + j["ledger_double_sends"]
        if not j["accounted"]:
            row["accounted"] = f"job FAIL {j['states']}"
    return row


def run(opts: Options) -> dict[str, Any]:
    backend = "postgres" if common.pg_available() else "sqlite"
    rows = [_level(backend, c, opts) for c in opts.concurrency]
    where = "service level (deliver_due)" + (
        " and the job's digest_deliveries phase (job_*)" if opts.with_job else " only"
    )
    tables.print_table(
        f"Latency-bound, {opts.latency_ms:g} ms per send, {backend}: {where}; "
        "bound = concurrency / latency; target >= 70 % up to concurrency 64",
        rows,
        COLUMNS,
    )
    return tables.publish("latency", rows, opts)


def main(argv: Sequence[str]) -> int:
    if common.child_main(argv, job_run.measure_job):
        return 0
    p = argparse.ArgumentParser(prog="python -m benchmarks.latency", description=__doc__)
    p.add_argument("--concurrency", type=tables.int_list, default=list(CONCURRENCY))
    p.add_argument("--latency-ms", type=float, default=LATENCY_MS)
    p.add_argument("--min-items", type=int, default=MIN_ITEMS)
    p.add_argument("--no-job", action="store_true", help="service level only")
    p.add_argument("--json-dir", type=Path, default=common.DEFAULT_JSON_DIR)
    a = p.parse_args(argv)
    run(Options(a.concurrency, a.latency_ms, a.min_items, not a.no_job, a.json_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
