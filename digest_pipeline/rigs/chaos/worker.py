"""One chaos worker process: sweeps one period through the real services until it is drained.

Started (and SIGKILLed, and restarted) by `digest_pipeline.rigs.chaos.fleet`. Each pass is
`services.pipeline.run_pass` for the one period, as `digest sweep` runs it, delivering through
the real HTTP provider mailer (rendered by the simulator's cheap composer). After each gate it
prints one JSON line to stdout (flushed, so a kill loses only the gate it interrupts); it exits 0
once every item of the period is terminal, 3 if its deadline passes first, 4 if it is refused.

The ledger's URL comes from `DIGEST_CHAOS_DATABASE_URL`, not the command line, so a password
never shows in `ps`.
"""

import argparse
import json
import logging
import os
import random
import sys
import time
from datetime import timedelta
from functools import partial

from digest_pipeline.adapters.clock import SystemClock
from digest_pipeline.adapters.mail.http import HttpProviderMailer
from digest_pipeline.adapters.sql.engine import create_ledger_engine
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.domain.model import CleanupMode
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.retry import RetryPolicy
from digest_pipeline.domain.states import TERMINAL
from digest_pipeline.ports import Ledger
from digest_pipeline.rigs.sim.shop import SimComposer
from digest_pipeline.runtime.executor import executor_for
from digest_pipeline.services.deliver import Deliverer
from digest_pipeline.services.pipeline import Gate, SweepReport, run_pass
from digest_pipeline.settings import ProviderSettings

DATABASE_URL_VARIABLE = "DIGEST_CHAOS_DATABASE_URL"
PROVIDER_KEY_VARIABLE = "DIGEST_CHAOS_PROVIDER_API_KEY"
EXIT_DEADLINE = 3
#: the period was refused (a missed week, a changed snapshot): nothing to drain
EXIT_REFUSED = 4
#: the provider's deduplication window, as the test server keeps it
IDEMPOTENCY_WINDOW = timedelta(hours=24)


#: the run's delivery window: open for the whole run at any hour (`policy_of`)
CHAOS_WINDOW = timedelta(days=14)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The worker's command line, as `fleet.Fleet.start` writes it."""
    p = argparse.ArgumentParser(prog="python -m digest_pipeline.rigs.chaos.worker")
    p.add_argument("--index", type=int, required=True, help="worker slot (the owner is w<i>:<pid>)")
    p.add_argument("--period", required=True)
    p.add_argument("--provider-url", required=True)
    p.add_argument("--seed", type=int, required=True, help="seeds the retry jitter")
    p.add_argument("--lease-seconds", type=float, required=True)
    p.add_argument("--retry-base-seconds", type=float, required=True)
    p.add_argument("--retry-cap-seconds", type=float, required=True)
    p.add_argument("--max-attempts", type=int, required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--concurrency", type=int, required=True)
    p.add_argument("--pass-items", type=int, required=True, help="claims per pass at most")
    p.add_argument("--idle-seconds", type=float, default=0.1)
    p.add_argument("--http-timeout-seconds", type=float, default=5.0)
    p.add_argument("--deadline-seconds", type=float, required=True)
    return p.parse_args(argv)


def policy_of(args: argparse.Namespace) -> DeliveryPolicy:
    """The run's short retry schedule and lease, from the command line, and a two-week window.

    The run's week is the latest complete one, whose default seven-day window closes when the
    current week ends: late on a Sunday it would close during the run and dead-letter the rest.
    """
    return DeliveryPolicy(
        retry=RetryPolicy(
            base=timedelta(seconds=args.retry_base_seconds),
            cap=timedelta(seconds=args.retry_cap_seconds),
            max_attempts=args.max_attempts,
            max_age=timedelta(hours=1),
        ),
        lease=timedelta(seconds=args.lease_seconds),
        delivery_window=CHAOS_WINDOW,
    )


def emit(record: dict[str, object]) -> None:
    """One pass record as a JSON line on stdout, flushed so a kill cannot swallow it."""
    sys.stdout.write(json.dumps(record, sort_keys=True) + "\n")
    sys.stdout.flush()


def emit_gate(passes: int, ledger: Ledger, period: Period, gate: Gate, report: SweepReport) -> None:
    """One record per gate of the pass, so a kill loses only the counts of the gate it cuts."""
    record: dict[str, object] = {"pass": passes, "step": gate.value}
    if gate is Gate.RECOVER:
        record |= {
            "requeued": len(report.recovered.requeued),
            "recovered_unknown": len(report.recovered.unknown),
        }
    elif gate is Gate.ADMIT:
        record["refused"] = {str(p): why for p, why in report.refused.items()}
    elif gate is Gate.RECONCILE and period in report.reconciled:
        reconciled = report.reconciled[period]
        record |= {
            "reconciled": dict(reconciled.evidence),
            "still_unknown": reconciled.still_unknown,
            "lost_races": {"reconcile": reconciled.lost_races},
        }
    elif gate is Gate.DELIVER:
        delivered = report.delivered
        record |= {
            "claimed": delivered.claimed,
            "outcomes": dict(delivered.outcomes),
            "lost_races": {"deliver": delivered.lost_races},
        }
    elif gate is Gate.CLEAN and period in report.cleaned:
        cleaned = report.cleaned[period]
        drained = all(state in TERMINAL for state in ledger.state_counts(period))
        record |= {
            "cleaned": cleaned.cleaned,
            "lost_races": {"cleanup": cleaned.lost_races},
            "drained": drained,
        }
    emit(record)


def busy(report: SweepReport, period: Period) -> bool:
    """Whether the pass moved anything: if not, what is left is leased or not yet due."""
    reconciled = report.reconciled.get(period)
    cleaned = report.cleaned.get(period)
    return bool(
        report.delivered.claimed
        or (cleaned is not None and cleaned.cleaned)
        or (reconciled is not None and sum(reconciled.moved.values()))
        or report.recovered.requeued
        or report.recovered.unknown
    )


def run(args: argparse.Namespace) -> int:
    """Sweeps the period pass after pass; 0 once it is drained, `EXIT_DEADLINE` if time ran out."""
    deadline = time.monotonic() + args.deadline_seconds
    period = Period.parse(args.period)
    policy = policy_of(args)
    clock = SystemClock()
    engine = create_ledger_engine(os.environ[DATABASE_URL_VARIABLE], pool_size=args.concurrency + 1)
    settings = ProviderSettings(
        url=args.provider_url,
        api_key=os.environ[PROVIDER_KEY_VARIABLE],
        timeout_seconds=args.http_timeout_seconds,
        idempotency_window=IDEMPOTENCY_WINDOW,
    )
    try:
        with HttpProviderMailer(settings) as mailer:
            ledger = SqlLedger(engine)
            deliverer = Deliverer(
                ledger=ledger,
                mailer=mailer,
                composer=SimComposer(),
                clock=clock,
                policy=policy,
                rand=random.Random(args.seed).random,
                owner=f"w{args.index}:{os.getpid()}",
                executor=executor_for(ledger),
            )
            passes = 0
            while True:
                passes += 1
                report = run_pass(
                    deliverer,
                    [period],
                    batch_size=args.batch_size,
                    concurrency=args.concurrency,
                    cleanup_mode=CleanupMode.ARCHIVE,
                    max_items=args.pass_items,
                    on_gate=partial(emit_gate, passes, ledger, period),
                )
                if report.refused:
                    sys.stderr.write(f"refused: {report.refused[period]}\n")
                    return EXIT_REFUSED
                counts = ledger.state_counts(period)
                if all(state in TERMINAL for state in counts):
                    return 0
                if time.monotonic() >= deadline:
                    left = {s.value: n for s, n in counts.items() if s not in TERMINAL}
                    sys.stderr.write(f"deadline passed with items left: {left}\n")
                    return EXIT_DEADLINE
                if not busy(report, period):
                    time.sleep(args.idle_seconds)  # what is left is leased, or not yet due
    finally:
        engine.dispose()


def main(argv: list[str] | None = None) -> int:
    """The process's entry point: warnings and errors to stderr, then `run`."""
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s",
    )
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
