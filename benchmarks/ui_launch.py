"""UI launch against `digest run`: one week of one shop, from the operator's action to the end.

Two identical shops (same seed, same week, SQLite ledger, outbox mailer, a SQLite DAGSTER_HOME
from the project's `dagster.yaml`). One week is delivered by the `digest` console script, timed
from its start to its exit (what an operator at the terminal waits for). The other is served by
`dagster dev` (webserver and daemon, as `make ui`), and the week is launched through the
webserver's GraphQL exactly as the asset graph's "Materialize all" launches it, timed from the
launch to the run's terminal status (queue, daemon, run worker process, steps; `queued_s` is the
part before the run started). Each path then runs the week again: a re-materialisation of a
delivered week, which sends nothing. `--executors in_process,multiprocess` adds UI launches with
run config selecting Dagster's multiprocess executor (a process per step), each on a shop of its
own.
"""

import argparse
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks import common, tables
from digest_pipeline.domain.periods import Period

MODULE = "benchmarks.ui_launch"
CUSTOMERS = 300
EXECUTORS = ("in_process",)
PASSES = ("first", "again")
#: UI run config per executor (the launchpad's text); `{}` is what "Materialize all" sends
RUN_CONFIG: dict[str, dict[str, Any]] = {
    "in_process": {},
    "multiprocess": {"execution": {"config": {"multiprocess": {}}}},
}
COLUMNS = (
    "path",
    "executor",
    "pass",
    "customers",
    "eligible",
    "wall_s",
    "run_s",
    "queued_s",
    "vs_digest",
    "new_sends",
    "accounted",
    "dup_sends",
    "status",
)


@dataclass(frozen=True)
class Options:
    customers: int = CUSTOMERS
    #: UI launches: `in_process` (the default executor), `multiprocess` (a process per step)
    executors: Sequence[str] = EXECUTORS
    #: give up on a UI run after this long
    run_timeout_s: float = 900.0
    json_dir: Path = field(default=common.DEFAULT_JSON_DIR)


@dataclass(frozen=True)
class Shop:
    env: dict[str, str]
    work: Path
    seeded: common.Seeded
    ledger_url: str

    def sends(self) -> int:
        return len(list((self.work / "outbox" / "new").glob("*.eml")))


def _environ() -> dict[str, str]:
    """This environment without the caller's `DIGEST_*` settings and Dagster home or storage."""
    return {
        k: v
        for k, v in os.environ.items()
        if not (k.startswith("DIGEST_") and "_TEST_" not in k)
        and not (k == "DAGSTER_HOME" or k.startswith("DAGSTER_PG_"))
    }


@contextmanager
def _shop(tag: str, customers: int, now: datetime, period: Period) -> Iterator[Shop]:
    """A freshly seeded shop with its own Dagster home, and the environment that points at it."""
    with common.workdir(f"ui-{tag}") as work:
        url = f"sqlite:///{work / 'ledger.db'}"
        seeded = common.seed(url, customers, now)
        home = common.dagster_home(work, None)
        # keep the week's delivery window open for the whole measurement, whatever the weekday
        window = now + timedelta(days=1) - period.ends_at
        env = {
            **_environ(),
            "DIGEST_DATABASE_URL": url,
            "DIGEST_MAILER": "outbox",
            "DIGEST_OUTBOX_DIR": str(work / "outbox"),
            "DIGEST_DELIVERY_WINDOW_SECONDS": str(int(window.total_seconds())),
            "DAGSTER_HOME": str(home),
        }
        yield Shop(env, work, seeded, url)


def _row(shop: Shop, period: Period, before: int, **figures: Any) -> dict[str, Any]:
    verdict = common.ledger_verdict(shop.ledger_url, period, shop.seeded)
    return {
        **figures,
        "customers": shop.seeded.customers,
        "eligible": shop.seeded.eligible,
        "new_sends": shop.sends() - before,
        "sends": shop.sends(),
        "accounted": tables.accounted_cell(verdict),
        "dup_sends": verdict["ledger_double_sends"],
        "verdict": verdict,
    }


def _digest_rows(shop: Shop, period: Period) -> list[dict[str, Any]]:
    """`digest run --period P` twice, each timed from process start to exit."""
    import dagster as dg

    from digest_pipeline.rigs.servers.webserver import digest_run

    rows = []
    for name in PASSES:
        before = shop.sends()
        with common.Timer() as timer:
            run_id = digest_run(shop.env, str(period), timeout=3600)
        instance = dg.DagsterInstance.from_config(shop.env["DAGSTER_HOME"])
        try:
            record = instance.get_run_record_by_id(run_id)
        finally:
            instance.dispose()
        started, ended = (record.start_time, record.end_time) if record else (None, None)
        rows.append(
            _row(
                shop,
                period,
                before,
                path="digest run",
                executor="in_process",
                **{"pass": name},
                run_id=run_id,
                status="SUCCESS",
                wall_s=round(timer.seconds, 2),
                run_s=round(ended - started, 2) if started and ended else None,
            )
        )
        common.progress(f"{MODULE} digest run ({name}): {timer.seconds:,.1f} s")
    return rows


def _ui_rows(shop: Shop, period: Period, executor: str, timeout: float) -> list[dict[str, Any]]:
    """The week launched twice from the webserver, each timed from launch to its end."""
    from digest_pipeline.rigs.servers.webserver import (
        launch_partition,
        run_messages,
        running_webserver,
        wait_for_run,
    )

    rows = []
    with running_webserver(
        shop.env, shop.work / "logs", dev=True, startup_timeout=180, stop_timeout=60
    ) as server:
        for name in PASSES:
            before = shop.sends()
            launched = time.time()
            with common.Timer() as timer:
                run_id = launch_partition(
                    server, period.partition_key, run_config=RUN_CONFIG[executor]
                )
                run = wait_for_run(server, run_id, timeout)
            started, ended = run.get("startTime"), run.get("endTime")
            # a failed run's last messages, so the table's `status` can be explained
            tail = run_messages(server, run_id)[-5:] if run["status"] != "SUCCESS" else []
            rows.append(
                _row(
                    shop,
                    period,
                    before,
                    path="ui launch",
                    executor=executor,
                    **{"pass": name},
                    run_id=run_id,
                    status=run["status"],
                    wall_s=round(timer.seconds, 2),
                    run_s=round(ended - started, 2) if started and ended else None,
                    queued_s=round(started - launched, 2) if started else None,
                    errors=tail,
                )
            )
            common.progress(f"{MODULE} ui launch {executor} ({name}): {timer.seconds:,.1f} s")
    return rows


def _ratios(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """UI wall time over `digest run` wall time, per executor and pass."""
    digest = {r["pass"]: r["wall_s"] for r in rows if r["path"] == "digest run"}
    return [
        {
            "executor": r["executor"],
            "pass": r["pass"],
            "ui_over_digest": round(r["wall_s"] / digest[r["pass"]], 2),
        }
        for r in rows
        if r["path"] == "ui launch" and digest.get(r["pass"])
    ]


def run(opts: Options) -> dict[str, Any]:
    now = common.bench_now()
    period = common.latest_period(now)
    with _shop("digest", opts.customers, now, period) as shop:
        rows = _digest_rows(shop, period)
    for executor in opts.executors:
        with _shop(executor, opts.customers, now, period) as shop:
            rows += _ui_rows(shop, period, executor, opts.run_timeout_s)
    ratios = _ratios(rows)
    by_key = {(r["executor"], r["pass"]): r["ui_over_digest"] for r in ratios}
    for r in rows:
        if r["path"] == "ui launch":
            r["vs_digest"] = by_key.get((r["executor"], r["pass"]))
    tables.print_table(
        f"UI launch against digest run: {period}, {opts.customers:,} customers, SQLite ledger "
        "and Dagster home, outbox mailer; wall_s = digest: process start to exit, ui: GraphQL "
        "launch (as 'Materialize all') to the run's end under dagster dev; run_s = the Dagster "
        "run's own start to end; queued_s = launch to run start (daemon dequeue, run worker); "
        "vs_digest = ui wall / digest wall of the same pass; pass 'again' re-materialises a "
        "delivered week (new_sends must be 0)",
        rows,
        COLUMNS,
    )
    return tables.publish("ui_launch", rows, opts, ratios=ratios, period=str(period))


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ui_launch", description=__doc__)
    p.add_argument("--customers", type=int, default=CUSTOMERS)
    p.add_argument(
        "--executors",
        type=tables.str_list,
        default=list(EXECUTORS),
        help="UI launches: in_process (the default), multiprocess (a process per step)",
    )
    p.add_argument("--run-timeout-seconds", type=float, default=Options.run_timeout_s)
    p.add_argument("--json-dir", type=Path, default=common.DEFAULT_JSON_DIR)
    a = p.parse_args(argv)
    unknown = set(a.executors) - set(RUN_CONFIG)
    if unknown:
        p.error(f"unknown executor(s): {', '.join(sorted(unknown))}")
    run(Options(a.customers, a.executors, a.run_timeout_seconds, a.json_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
