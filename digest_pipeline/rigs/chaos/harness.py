"""Real process kills on PostgreSQL: SIGKILL delivery workers mid-send, then prove nothing broke.

The experiment:

1. A fresh PostgreSQL database (`CREATE DATABASE chaos_<random>` on the server of
   `DIGEST_TEST_DATABASE_URL`, dropped afterwards), migrated, with one period of N customers
   frozen and enqueued by `seed_period`. A database of its own keeps the run clear of the other
   tests, which drop and truncate the shared test database's tables.
2. The real HTTP provider test server on 127.0.0.1 in this process, idempotent over a 24 h
   window, wrapped so that every accepted send takes a few random milliseconds before and after
   the provider stores it: a kill lands before, during and after the provider's acceptance.
3. K worker processes (`python -m digest_pipeline.rigs.chaos.worker`) sweep the period through
   `services.pipeline.run_pass`: recover expired leases, admit, reconcile, deliver, clean.
4. R rounds: when the period's progress passes a random fraction (drawn once, sorted), the
   harness SIGKILLs a random non-empty subset of the running workers, waits a random moment and
   starts them again. Killed claims come back only when their short lease expires.
5. After the last round the workers finish the period and exit 0; the time from the last kill
   until every item is terminal is the recovery time. A run that does not drain by its timeout
   fails instead of hanging.

The checks, from the provider's own store and the ledger: every selected customer delivered
exactly once (`delivered_count == 1`; replays the provider deduplicated are reported, not
failed), one cleanup row per key and every item `cleaned`, no item lost or stuck, every design §4
invariant passing (`no_silent_timeout` included), every kill landing while work was left and the
last generation of workers exiting 0. Any failure raises `ChaosFailed` (an AssertionError)
carrying the worker logs.

`python -m digest_pipeline.rigs.chaos.harness` (or `make chaos`, through `benchmarks/chaos.py`)
runs it from the command line; the tests' `chaos/test_process_kills.py` runs the short version
under pytest.
"""

import argparse
import contextlib
import os
import random
import secrets
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.states import TERMINAL, DeliveryState
from digest_pipeline.rigs.bootstrap import open_rig_ledger
from digest_pipeline.rigs.chaos.fleet import Fleet
from digest_pipeline.rigs.chaos.settings import API_KEY, SHORT, ChaosSettings
from digest_pipeline.rigs.chaos.verdict import ChaosFailed, ChaosReport, check, measure
from digest_pipeline.rigs.seeding import seed_period
from digest_pipeline.rigs.servers.provider_actions import Action, store_then_hang
from digest_pipeline.rigs.servers.provider_server import ProviderServer

DATABASE_URL_VARIABLE = "DIGEST_TEST_DATABASE_URL"
POLL_SECONDS = 0.05
#: progress counts an item once the provider's answer is recorded: sent or beyond
SETTLED = frozenset({DeliveryState.SENT, *TERMINAL})


# -- the database ------------------------------------------------------------------------------


@contextlib.contextmanager
def chaos_database(base_url: str) -> Iterator[str]:
    """A new, empty database on the server of `base_url`, dropped (forcibly) afterwards."""
    url = make_url(base_url)
    if url.get_backend_name() != "postgresql":
        raise ValueError(f"the chaos harness needs PostgreSQL, not {url.get_backend_name()}")
    name = f"chaos_{secrets.token_hex(4)}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield url.set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


# -- the provider ------------------------------------------------------------------------------


class SlowProvider(ProviderServer):
    """The idempotent test provider, with a random real delay before storing and before replying.

    The delay before storing keeps the key in flight (a concurrent resend gets a 409); the delay
    after storing is the window in which a kill leaves a message delivered but unrecorded.
    """

    def __init__(self, *, before_ms: float, after_ms: float, seed: int, api_key: str) -> None:
        super().__init__(api_key=api_key, window_seconds=24 * 3600.0)
        self._before = before_ms / 1000
        self._after = after_ms / 1000
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()

    def _accept(self, h: Any, key: str, body: dict[str, Any], action: Action) -> None:
        with self._rng_lock:
            before = self._rng.uniform(0, self._before)
            after = self._rng.uniform(0, self._after)
        time.sleep(before)
        if action.kind == "ok" and after > 0:
            action = store_then_hang(after)
        super()._accept(h, key, body, action)


# -- the run -----------------------------------------------------------------------------------


def chaos_period(now: datetime) -> Period:
    """The latest complete week; the workers' window (`worker.CHAOS_WINDOW`) keeps it open."""
    return Period.of((now - timedelta(days=7)).date())


def run_chaos(base_url: str, settings: ChaosSettings, log_dir: Path) -> ChaosReport:
    """Runs the experiment on a fresh database beside `base_url`'s; the report holds the verdict."""
    started = time.monotonic()
    deadline = started + settings.timeout_seconds
    now = datetime.now(UTC)
    period = chaos_period(now)
    report = ChaosReport(settings, period)
    log_dir.mkdir(parents=True, exist_ok=True)
    with (
        chaos_database(base_url) as url,
        SlowProvider(
            before_ms=settings.provider_delay_before_ms,
            after_ms=settings.provider_delay_after_ms,
            seed=settings.seed,
            api_key=API_KEY,
        ) as provider,
        open_rig_ledger(url) as ledger,
    ):
        keys = [str(k) for k in seed_period(ledger, settings.customers, period=period, now=now)]
        fleet = Fleet(
            settings,
            database_url=url,
            provider_url=provider.url,
            period=period,
            log_dir=log_dir,
            deadline=deadline,
        )
        try:
            _drive(fleet, ledger, report, settings, deadline)
        finally:
            fleet.stop_all()
        measure(report, ledger, provider, fleet, keys)
        check(report, ledger, provider, fleet, keys)
        logs = fleet.logs() if report.failures else ""
    report.wall_seconds = time.monotonic() - started
    if report.failures:
        raise ChaosFailed(
            "\n".join(
                [
                    "chaos run failed:",
                    *(f"  - {f}" for f in report.failures),
                    *report.lines(),
                    logs,
                ]
            )
        )
    return report


def _drive(
    fleet: Fleet, ledger: SqlLedger, report: ChaosReport, s: ChaosSettings, deadline: float
) -> None:
    """Starts the workers, runs the kill rounds, and waits for the period to drain."""
    rng = random.Random(s.seed)
    marks = sorted(rng.uniform(*s.kill_progress) for _ in range(s.rounds))
    period, total = report.period, s.customers

    def progress() -> float:
        counts = ledger.state_counts(period)
        return sum(n for state, n in counts.items() if state in SETTLED) / total

    def left() -> int:
        counts = ledger.state_counts(period)
        return total - sum(n for state, n in counts.items() if state in TERMINAL)

    def drained() -> bool:
        return left() == 0

    def wait_for(what: str, ready: Callable[[], bool]) -> None:
        while not ready():
            if crashed := fleet.crashed():
                names = ", ".join(i.name for i in crashed)
                raise ChaosFailed(f"worker exited non-zero ({names}) while {what}\n{fleet.logs()}")
            if time.monotonic() >= deadline:
                raise ChaosFailed(
                    f"timed out after {s.timeout_seconds:g} s {what}; states "
                    f"{ {k.value: v for k, v in ledger.state_counts(period).items()} }\n"
                    f"{fleet.logs()}"
                )
            time.sleep(POLL_SECONDS)

    began = time.monotonic()
    for index in range(s.workers):
        fleet.start(index)
    last_kill: float | None = None
    for number, mark in enumerate(marks, start=1):
        wait_for(f"waiting for progress {mark:.0%} (round {number})", _at_least(progress, mark))
        time.sleep(rng.uniform(0, s.kill_jitter_seconds))
        running = fleet.running()
        victims = rng.sample(running, rng.randint(1, len(running))) if running else []
        report.left_at_last_kill = left()
        work_left = report.left_at_last_kill > 0
        for victim in victims:
            fleet.kill(victim)
        last_kill = time.monotonic()
        report.rounds += 1
        report.kills += len(victims)
        report.kills_mid_work += len(victims) if work_left else 0
        report.rounds_mid_work += 1 if work_left and victims else 0
        time.sleep(rng.uniform(0, s.restart_pause_seconds))
        for victim in victims:
            fleet.start(victim.index)
    wait_for("waiting for every item to become terminal", drained)
    done = time.monotonic()
    report.drain_seconds = done - began
    report.recovery_seconds = None if last_kill is None else done - last_kill
    wait_for("waiting for the workers to exit", fleet.all_exited)
    report.processes_started = len(fleet.incarnations)


def _at_least(value: Callable[[], float], mark: float) -> Callable[[], bool]:
    return lambda: value() >= mark


# -- the command line --------------------------------------------------------------------------


def parse_args(
    argv: list[str] | None, base: ChaosSettings
) -> tuple[argparse.Namespace, ChaosSettings]:
    """The command line over `base`: the parsed arguments and the settings they give."""
    p = argparse.ArgumentParser(
        prog="python -m digest_pipeline.rigs.chaos.harness",
        description="SIGKILL delivery workers on PostgreSQL and check exactly-once delivery "
        f"and cleanup (the database server comes from ${DATABASE_URL_VARIABLE}).",
    )
    p.add_argument("--customers", type=int, default=base.customers)
    p.add_argument("--workers", type=int, default=base.workers)
    p.add_argument("--rounds", type=int, default=base.rounds)
    p.add_argument("--seed", type=int, default=base.seed)
    p.add_argument("--lease-seconds", type=float, default=base.lease_seconds)
    p.add_argument("--concurrency", type=int, default=base.concurrency)
    p.add_argument("--timeout-seconds", type=float, default=base.timeout_seconds)
    p.add_argument("--log-dir", type=Path, help="keep the worker logs here (default: a temp dir)")
    args = p.parse_args(argv)
    settings = replace(
        base,
        customers=args.customers,
        workers=args.workers,
        rounds=args.rounds,
        seed=args.seed,
        lease_seconds=args.lease_seconds,
        concurrency=args.concurrency,
        timeout_seconds=args.timeout_seconds,
    )
    return args, settings


def main(argv: list[str] | None = None, base: ChaosSettings = SHORT) -> int:
    """Runs one experiment, prints its figures; 0 when every check passed, 1 otherwise."""
    args, settings = parse_args(argv, base)
    url = os.environ.get(DATABASE_URL_VARIABLE)
    if not url:
        sys.stderr.write(
            f"error: {DATABASE_URL_VARIABLE} is not set (run under scripts/pg-test-cluster.sh)\n"
        )
        return 2
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="digest-chaos-"))
    try:
        report = run_chaos(url, settings, log_dir)
    except ChaosFailed as e:
        sys.stderr.write(f"{e}\n")
        return 1
    sys.stdout.write("\n".join(report.lines()) + "\n")
    if args.log_dir is None:
        shutil.rmtree(log_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
