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
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.states import TERMINAL, DeliveryState
from digest_pipeline.rigs.bootstrap import PROJECT_ROOT, open_rig_ledger
from digest_pipeline.rigs.chaos import worker
from digest_pipeline.rigs.seeding import seed_period
from digest_pipeline.rigs.servers.provider_actions import Action, store_then_hang
from digest_pipeline.rigs.servers.provider_server import ProviderServer

DATABASE_URL_VARIABLE = "DIGEST_TEST_DATABASE_URL"
API_KEY = "re_test_chaos_harness"
POLL_SECONDS = 0.05
#: progress counts an item once the provider's answer is recorded: sent or beyond
SETTLED = frozenset({DeliveryState.SENT, *TERMINAL})


@dataclass(frozen=True)
class ChaosSettings:
    """Every knob of one run; `SHORT` runs inside `make test`, `LONG` under `make chaos`."""

    customers: int = 300
    workers: int = 3
    rounds: int = 3
    seed: int = 20261019
    #: the visibility timeout: how long a killed worker's claims stay invisible
    lease_seconds: float = 2.0
    retry_base_seconds: float = 0.2
    retry_cap_seconds: float = 2.0
    #: generous: a key killed mid-send several times must not run out of attempts
    max_attempts: int = 25
    batch_size: int = 8
    concurrency: int = 4
    #: claims per worker pass; each pass also recovers leases, reconciles and cleans
    pass_items: int = 40
    #: upper bounds of the provider's random wait before it stores a message and before it
    #: answers, in milliseconds: sends take real time, so kills land mid-send
    provider_delay_before_ms: float = 8.0
    provider_delay_after_ms: float = 12.0
    #: kills happen when the period's progress passes a fraction drawn from this range
    kill_progress: tuple[float, float] = (0.05, 0.85)
    #: the random extra wait after a progress mark is reached, and before restarting victims
    kill_jitter_seconds: float = 0.3
    restart_pause_seconds: float = 0.5
    #: the whole run, seeding to verdict: a stuck item fails the run instead of hanging it
    timeout_seconds: float = 90.0


SHORT = ChaosSettings()
LONG = ChaosSettings(customers=5_000, workers=4, rounds=10, pass_items=100, timeout_seconds=900.0)


class ChaosFailed(AssertionError):
    """A check failed; the message carries the figures and the worker logs."""


@dataclass
class ChaosReport:
    """The figures of one run and the checks that failed (none: the run passed)."""

    settings: ChaosSettings
    period: Period
    items: int = 0
    rounds: int = 0
    kills: int = 0
    kills_mid_work: int = 0
    rounds_mid_work: int = 0
    #: items not yet terminal when the last kill landed: the work the recovery time includes
    left_at_last_kill: int = 0
    processes_started: int = 0
    provider_deliveries: int = 0
    provider_duplicates: int = 0
    suppressed_replays: int = 0
    provider_requests: int = 0
    provider_conflicts_in_flight: int = 0
    provider_replies_cut: int = 0
    attempts: dict[str, int] = field(default_factory=dict)
    attempts_cut_off: int = 0
    leases_requeued: int = 0
    leases_to_unknown: int = 0
    unknowns_seen: int = 0
    unknowns_left: int = 0
    reconciled: dict[str, int] = field(default_factory=dict)
    lost_races: dict[str, int] = field(default_factory=dict)
    states: dict[str, int] = field(default_factory=dict)
    cleanups: int = 0
    recovery_seconds: float | None = None
    drain_seconds: float | None = None
    wall_seconds: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def lines(self) -> list[str]:
        s = self.settings

        def secs(value: float | None) -> str:
            return "n/a" if value is None else f"{value:.1f} s"

        attempts = ", ".join(f"{k} {v}" for k, v in sorted(self.attempts.items())) or "none"
        reconciled = ", ".join(f"{k} {v}" for k, v in sorted(self.reconciled.items())) or "none"
        races = ", ".join(f"{k} {v}" for k, v in sorted(self.lost_races.items()))
        return [
            f"chaos: {self.items} items of {self.period}, {s.workers} worker processes "
            f"(concurrency {s.concurrency}, lease {s.lease_seconds:g} s), seed {s.seed}",
            f"rounds                                 {self.rounds}",
            f"kills (SIGKILL)                        {self.kills} "
            f"({self.kills_mid_work} while items were left; "
            f"{self.processes_started} worker processes started)",
            f"items                                  {self.items} "
            f"(end states: {self._states()}; cleanup rows {self.cleanups})",
            f"provider deliveries                    {self.provider_deliveries}",
            f"duplicate deliveries (provider-side)   {self.provider_duplicates}",
            f"duplicates suppressed by the provider  {self.suppressed_replays} replays "
            f"({self.provider_conflicts_in_flight} more refused with 409 while in flight)",
            f"provider requests                      {self.provider_requests} "
            f"({self.provider_replies_cut} replies cut off by a kill)",
            f"attempts                               {sum(self.attempts.values())} ({attempts})",
            f"attempts cut off mid-send              {self.attempts_cut_off}",
            f"expired leases recovered (by workers)  {self.leases_requeued} requeued, "
            f"{self.leases_to_unknown} to unknown",
            f"unknowns seen during the run           {self.unknowns_seen} "
            f"(reconciled by evidence: {reconciled})",
            f"unknowns left at the end               {self.unknowns_left}",
            f"lost races (reported by workers)       {sum(self.lost_races.values())} ({races})",
            f"recovery time after the last kill      {secs(self.recovery_seconds)} "
            f"(until every item was terminal; {self.left_at_last_kill} were not at that kill)",
            f"drain time (workers started to done)   {secs(self.drain_seconds)}",
            f"wall time (seed to verdict)            {secs(self.wall_seconds)}",
            "verdict                                "
            + ("PASS" if self.passed else f"FAIL ({len(self.failures)} checks)"),
        ]

    def _states(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(self.states.items())) or "none"


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


# -- the workers -------------------------------------------------------------------------------


@dataclass
class Incarnation:
    """One worker process: its slot, generation, logs and fate."""

    index: int
    generation: int
    process: "subprocess.Popen[bytes]"
    stdout: Path
    stderr: Path
    killed: bool = False

    @property
    def name(self) -> str:
        return f"w{self.index}-{self.generation} (pid {self.process.pid})"


class Fleet:
    """Starts, kills and restarts the worker processes; never leaves one running."""

    def __init__(
        self,
        settings: ChaosSettings,
        *,
        database_url: str,
        provider_url: str,
        period: Period,
        log_dir: Path,
        deadline: float,
    ) -> None:
        self._settings = settings
        self._provider_url = provider_url
        self._period = period
        self._log_dir = log_dir
        self._deadline = deadline
        self._env = {
            **os.environ,
            worker.DATABASE_URL_VARIABLE: database_url,
            worker.PROVIDER_KEY_VARIABLE: API_KEY,
        }
        self.incarnations: list[Incarnation] = []
        self.current: dict[int, Incarnation] = {}

    def start(self, index: int) -> Incarnation:
        s = self._settings
        generation = sum(1 for i in self.incarnations if i.index == index)
        remaining = max(self._deadline - time.monotonic(), 1.0)
        argv = [
            sys.executable,
            "-m",
            "digest_pipeline.rigs.chaos.worker",
            f"--index={index}",
            f"--period={self._period}",
            f"--provider-url={self._provider_url}",
            f"--seed={s.seed * 1000 + index * 100 + generation}",
            f"--lease-seconds={s.lease_seconds}",
            f"--retry-base-seconds={s.retry_base_seconds}",
            f"--retry-cap-seconds={s.retry_cap_seconds}",
            f"--max-attempts={s.max_attempts}",
            f"--batch-size={s.batch_size}",
            f"--concurrency={s.concurrency}",
            f"--pass-items={s.pass_items}",
            f"--deadline-seconds={remaining:.1f}",
        ]
        out = self._log_dir / f"w{index}-{generation}.out"
        err = self._log_dir / f"w{index}-{generation}.err"
        # the child holds its own copies of the descriptors; ours close right away
        with out.open("wb") as stdout, err.open("wb") as stderr:
            process = subprocess.Popen(
                argv,
                cwd=PROJECT_ROOT,
                env=self._env,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
            )
        incarnation = Incarnation(index, generation, process, out, err)
        self.incarnations.append(incarnation)
        self.current[index] = incarnation
        return incarnation

    def running(self) -> list[Incarnation]:
        return [i for i in self.current.values() if i.process.poll() is None]

    def kill(self, incarnation: Incarnation) -> None:
        with contextlib.suppress(ProcessLookupError):
            incarnation.process.send_signal(signal.SIGKILL)
        incarnation.process.wait()
        incarnation.killed = True

    def crashed(self) -> list[Incarnation]:
        """Workers that exited on their own with a non-zero status."""
        return [
            i
            for i in self.incarnations
            if not i.killed and i.process.poll() is not None and i.process.returncode != 0
        ]

    def all_exited(self) -> bool:
        return all(i.process.poll() is not None for i in self.current.values())

    def stop_all(self) -> None:
        """SIGKILLs whatever still runs and reaps every process (the `finally` of a run)."""
        for incarnation in self.incarnations:
            if incarnation.process.poll() is None:
                self.kill(incarnation)
            else:
                incarnation.process.wait()

    def records(self) -> Iterator[dict[str, Any]]:
        """Every pass record the workers printed (a kill may cut the last line short)."""
        for incarnation in self.incarnations:
            for line in incarnation.stdout.read_text(errors="replace").splitlines():
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    if isinstance(record, dict):
                        yield record

    def logs(self, *, max_workers: int = 8, tail: int = 15) -> str:
        """Exit statuses, and the stderr tails of the workers that wrote any."""
        parts = [f"worker logs in {self._log_dir}:"]
        for i in self.incarnations:
            code = i.process.poll()
            fate = "SIGKILLed" if i.killed else "running" if code is None else f"exit {code}"
            parts.append(f"  {i.name}: {fate}; {i.stdout.name}, {i.stderr.name}")
        noisy = [i for i in self.incarnations if i.stderr.exists() and i.stderr.stat().st_size]
        for i in noisy[-max_workers:]:
            lines = i.stderr.read_text(errors="replace").splitlines()[-tail:]
            parts.append(f"--- {i.name} stderr (last {len(lines)} lines) ---")
            parts.extend(lines)
        return "\n".join(parts)


# -- the run -----------------------------------------------------------------------------------


def chaos_period(now: datetime) -> Period:
    """The latest complete week: its delivery window is open for the whole run, on any day."""
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
        _measure(report, ledger, provider, fleet, keys)
        _check(report, ledger, provider, fleet, keys)
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


def _measure(
    report: ChaosReport,
    ledger: SqlLedger,
    provider: ProviderServer,
    fleet: Fleet,
    keys: list[str],
) -> None:
    """The figures, from the provider's store, the ledger and the workers' pass records."""
    period = report.period
    report.items = len(keys)
    report.states = {s.value: n for s, n in ledger.state_counts(period).items()}
    report.provider_deliveries = sum(len(v) for v in provider.stored.values())
    report.provider_duplicates = sum(max(provider.delivered_count(k) - 1, 0) for k in keys)
    report.suppressed_replays = sum(provider.replays(k) for k in keys)
    report.provider_requests = provider.requests
    report.provider_replies_cut = provider.handler_errors
    report.attempts = ledger.attempt_outcome_counts(period)
    tally = ledger.attempt_tally(period)
    report.attempts_cut_off = tally.open_attempts
    report.provider_conflicts_in_flight = ledger.attempts_with_detail(
        period, "http:409:concurrent_idempotent_requests"
    )
    report.unknowns_seen = ledger.keys_ever_unknown(period)
    report.cleanups = sum(ledger.cleanup_rows_per_key(period).values())
    report.unknowns_left = report.states.get(DeliveryState.UNKNOWN.value, 0)
    reconciled: Counter[str] = Counter()
    races: Counter[str] = Counter({"deliver": 0, "reconcile": 0, "cleanup": 0})
    for record in fleet.records():
        report.leases_requeued += int(record.get("requeued", 0))
        report.leases_to_unknown += int(record.get("recovered_unknown", 0))
        reconciled.update(record.get("reconciled", {}))
        races.update(record.get("lost_races", {}))
    report.reconciled, report.lost_races = dict(reconciled), dict(races)


def _check(
    report: ChaosReport,
    ledger: SqlLedger,
    provider: ProviderServer,
    fleet: Fleet,
    keys: list[str],
) -> None:
    """Every check of the experiment; each failure is one line in `report.failures`."""
    fail = report.failures.append
    selected = set(keys)

    def sample(found: list[str] | set[str]) -> str:
        ordered = sorted(found)
        return ", ".join(ordered[:5]) + (" ..." if len(ordered) > 5 else "")

    # every selected customer delivered exactly once, by the provider's own store
    not_once = {k: provider.delivered_count(k) for k in keys if provider.delivered_count(k) != 1}
    if not_once:
        counts = Counter(not_once.values())
        fail(
            f"{len(not_once)} keys not delivered exactly once (deliveries: {dict(counts)}): "
            f"{sample(set(not_once))}"
        )
    if strangers := set(provider.stored) - selected:
        fail(f"the provider stored {len(strangers)} keys nobody selected: {sample(strangers)}")
    # no item lost or stuck; every one cleaned
    items = {str(i.key): i for i in ledger.items(report.period)}
    if lost := selected - set(items):
        fail(f"{len(lost)} selected customers have no work item: {sample(lost)}")
    if extra := set(items) - selected:
        fail(f"{len(extra)} work items for customers nobody selected: {sample(extra)}")
    if not_cleaned := {k for k, i in items.items() if i.state is not DeliveryState.CLEANED}:
        states = Counter(items[k].state.value for k in not_cleaned)
        fail(f"{len(not_cleaned)} items not cleaned ({dict(states)}): {sample(not_cleaned)}")
    # every sent item cleaned exactly once: one cleanup row per key
    rows = ledger.cleanup_rows_per_key(report.period)
    if wrong := {k for k in selected | set(rows) if rows.get(k, 0) != 1}:
        fail(f"{len(wrong)} keys without exactly one cleanup row: {sample(wrong)}")
    # design §4, on what the ledger recorded (no_silent_timeout among them)
    for result in ledger.check_invariants(report.period, datetime.now(UTC)):
        if not result.passed:
            fail(f"invariant {result.name} failed for {result.violations} keys: {result.sample}")
    # the experiment itself: kills landed on live work, and the survivors finished cleanly
    if report.rounds_mid_work < report.settings.rounds or report.kills_mid_work < report.kills:
        fail(
            f"only {report.rounds_mid_work} of {report.settings.rounds} rounds "
            f"({report.kills_mid_work} of {report.kills} kills) landed while items were left: "
            "the run proves less than it claims"
        )
    if bad := [i for i in fleet.current.values() if i.process.returncode != 0]:
        fail("workers of the last generation did not exit 0: " + ", ".join(i.name for i in bad))


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
