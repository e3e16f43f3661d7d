"""One measured run of `weekly_digest_job` in a child process: time, statements, memory, verdicts."""

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import (
    Seeded,
    ServerStatements,
    StatementCounter,
    Timer,
    backend,
    bench_now,
    dagster_home,
    env,
    hermetic,
    key_log_duplicates,
    latest_period,
    ledger_verdict,
    peak_rss_mb,
    progress,
    reap_forkserver,
    run_child,
    run_config,
    seed,
    step_spans,
    workdir,
)
from digest_pipeline.domain.periods import Period

#: the setting that gives a batch step delivery helper processes (runtime/helpers.py)
DELIVERY_PROCESSES_ENV = "DIGEST_DELIVERY_PROCESSES"


@dataclass(frozen=True)
class JobSpec:
    """One run of `weekly_digest_job`, as a child process receives it (JSON)."""

    ledger_url: str
    dagster_pg_url: str | None
    workdir: str
    partition: str
    seeded: dict[str, int]
    #: `inproc` (the benchmark mailer, `latency_ms` per send) or `outbox` (the project's own)
    mailer: str = "inproc"
    latency_ms: float = 0.0
    #: `in_process` (what `digest run` does) or `multiprocess` (reconstructable job)
    executor: str = "in_process"
    processes: int = 1
    #: multiprocess only: Dagster's `start_method` (None: its default, `spawn`)
    start_method: str | None = None
    #: extra `DIGEST_*` settings for the run, e.g. `DIGEST_BATCH_SIZE`
    settings: dict[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def measure_job(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Runs the job once in this process and reports time, statements, memory and verdicts."""
    import dagster as dg

    from benchmarks import bench_defs
    from digest_pipeline.component.resources import DeliveryResource
    from digest_pipeline.definitions import defs

    spec = JobSpec(**raw)
    multiprocess = spec.executor == "multiprocess"
    # delivery helper processes (DIGEST_DELIVERY_PROCESSES): their sends are counted in files
    helpers = int((spec.settings or {}).get(DELIVERY_PROCESSES_ENV, "1")) > 1
    work = Path(spec.workdir)
    keys_dir = work / "keys"
    keys_dir.mkdir(parents=True, exist_ok=True)
    home = dagster_home(work, spec.dagster_pg_url)
    outbox = spec.mailer == "outbox"
    variables: dict[str, str | None] = {
        **hermetic(spec.settings or {}),
        "DIGEST_DATABASE_URL": spec.ledger_url,
        "DAGSTER_HOME": str(home),
        "DAGSTER_PG_URL": spec.dagster_pg_url,
        "DIGEST_MAILER": "outbox" if outbox else None,
        "DIGEST_OUTBOX_DIR": str(work / "outbox") if outbox else None,
        bench_defs.LATENCY_ENV: str(spec.latency_ms),
        # only other processes need a file; in one process the mailer's own counter is read
        bench_defs.KEYS_DIR_ENV: str(keys_dir) if multiprocess or helpers else None,
    }
    children_seen = True
    with env(variables):
        batch_size = DeliveryResource().settings().batch_size
        instance = dg.DagsterInstance.from_config(str(home))
        try:
            with (
                StatementCounter(spec.ledger_url) as statements,
                ServerStatements(spec.ledger_url) as server,
                Timer() as timer,
            ):
                if multiprocess:
                    result: Any = dg.execute_job(
                        dg.reconstructable(bench_defs.bench_job),
                        instance=instance,
                        run_config=run_config("multiprocess", spec.processes, spec.start_method),
                        tags={"dagster/partition": spec.partition},
                    )
                else:
                    project = (
                        defs()
                        if outbox
                        else bench_defs.bench_definitions(bench_defs.BenchMailerResource())
                    )
                    result = project.resolve_job_def(bench_defs.JOB).execute_in_process(
                        partition_key=spec.partition,
                        instance=instance,
                        raise_on_error=False,
                        run_config=run_config(),
                    )
            asset_s, steps, batches = step_spans(instance, result.run_id)
            # every entry is a row of Dagster's event log (one INSERT each on PostgreSQL)
            event_rows = len(instance.all_logs(result.run_id))
            checks = result.get_asset_check_evaluations()
        finally:
            instance.dispose()
            if multiprocess and spec.start_method == "forkserver":
                children_seen = reap_forkserver()
    seeded = Seeded(**spec.seeded)
    if outbox:
        sends, dup_sends = len(list((work / "outbox" / "new").glob("*.eml"))), None
    elif multiprocess or helpers:
        sends, dup_sends = key_log_duplicates(keys_dir)
    else:
        counts: Counter[str] = Counter()
        for mailer in bench_defs.OPENED:
            counts.update(mailer.sends)
        sends, dup_sends = sum(counts.values()), sum(1 for n in counts.values() if n > 1)
    return {
        "run_success": bool(result.success),
        "wall_s": round(timer.seconds, 3),
        "asset_s": asset_s,
        "delivery_s": asset_s.get("deliveries"),
        "steps": steps,
        "batches": batches,
        "batch_size": batch_size,
        # this process's listener sees neither step processes' nor helpers' statements
        "statements": None if multiprocess or helpers else statements.count,
        "server_statements": server.count,
        "server_transactions": server.transactions,
        "event_rows": event_rows,
        "checks_passed": sum(1 for c in checks if c.passed),
        "checks_total": len(checks),
        "failed_checks": sorted(c.check_name for c in checks if not c.passed),
        "sends": sends,
        "mailer_dup_sends": dup_sends,
        **ledger_verdict(spec.ledger_url, Period.parse(spec.partition), seeded),
        **peak_rss_mb(),
        **({} if children_seen else {"rss_children_mb": None}),
    }


def measure_in_child(
    module: str,
    backend_name: str,
    customers: int,
    **job: Any,
) -> dict[str, Any]:
    """Seeds a fresh database with `customers`, then runs the job once in a fresh child process.

    Returns the child's figures with the backend, the period and the seeded counts added.
    """
    now = bench_now()
    period = latest_period(now)
    with (
        workdir(module.rsplit(".", 1)[-1]) as work,
        backend(backend_name, work) as b,
    ):
        seeded = seed(b.ledger_url, customers, now)
        spec = JobSpec(
            b.ledger_url,
            b.dagster_pg_url,
            str(work),
            period.partition_key,
            dict(seeded.__dict__),
            **job,
        )
        out = run_child(module, spec.to_json(), work)
    progress(f"{module} {backend_name} {customers:,} customers: {out['wall_s']:,.1f} s")
    return {
        "backend": backend_name,
        "period": str(period),
        "customers": customers,
        "eligible": seeded.eligible,
        "invalid": seeded.invalid,
        **out,
    }
