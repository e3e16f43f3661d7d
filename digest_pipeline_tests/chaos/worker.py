"""One chaos worker process: sweeps one period through the real services until it is drained.

Started (and SIGKILLed, and restarted) by `digest_pipeline_tests.chaos.harness`. Each pass runs
what `digest sweep` runs, for the one period: recover expired leases, reconcile `unknown` items,
deliver due items through the real HTTP provider mailer, clean `sent` items. After each step it
prints one JSON line to stdout (flushed, so a kill loses only the step it interrupts); it
exits 0 once every item of the period is terminal, and 3 if its deadline passes first.

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

from digest_pipeline.adapters.clock import SystemClock
from digest_pipeline.adapters.http_mailer import HttpProviderMailer
from digest_pipeline.adapters.sql_engine import create_ledger_engine
from digest_pipeline.adapters.sql_ledger import SqlLedger
from digest_pipeline.domain.model import CleanupMode
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.retry import RetryPolicy
from digest_pipeline.domain.states import TERMINAL
from digest_pipeline.services.cleanup import clean_period
from digest_pipeline.services.deliver import Deliverer, deliver_due
from digest_pipeline.services.reconcile import reconcile_period
from digest_pipeline.settings import ProviderSettings
from digest_pipeline_tests.fakes import FakeComposer

DATABASE_URL_VARIABLE = "DIGEST_CHAOS_DATABASE_URL"
PROVIDER_KEY_VARIABLE = "DIGEST_CHAOS_PROVIDER_API_KEY"
EXIT_DEADLINE = 3
#: the provider's deduplication window, as the test server keeps it
IDEMPOTENCY_WINDOW = timedelta(hours=24)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m digest_pipeline_tests.chaos.worker")
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
    return DeliveryPolicy(
        retry=RetryPolicy(
            base=timedelta(seconds=args.retry_base_seconds),
            cap=timedelta(seconds=args.retry_cap_seconds),
            max_attempts=args.max_attempts,
            max_age=timedelta(hours=1),
        ),
        lease=timedelta(seconds=args.lease_seconds),
    )


def emit(record: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(record, sort_keys=True) + "\n")
    sys.stdout.flush()


def run(args: argparse.Namespace) -> int:
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
                composer=FakeComposer(),
                clock=clock,
                policy=policy,
                rand=random.Random(args.seed).random,
                owner=f"w{args.index}:{os.getpid()}",
            )
            passes = 0
            while True:
                passes += 1
                # one record per step, so a kill loses only the counts of the step it cuts
                recovered = ledger.recover_expired_leases(clock.now())
                emit(
                    {
                        "pass": passes,
                        "step": "recover",
                        "requeued": len(recovered.requeued),
                        "recovered_unknown": len(recovered.unknown),
                    }
                )
                reconciled = reconcile_period(ledger, mailer, clock, policy, period)
                emit(
                    {
                        "pass": passes,
                        "step": "reconcile",
                        "reconciled": dict(reconciled.evidence),
                        "still_unknown": reconciled.still_unknown,
                        "lost_races": {"reconcile": reconciled.lost_races},
                    }
                )
                delivered = deliver_due(
                    deliverer,
                    batch_size=args.batch_size,
                    concurrency=args.concurrency,
                    period=period,
                    max_items=args.pass_items,
                )
                emit(
                    {
                        "pass": passes,
                        "step": "deliver",
                        "claimed": delivered.claimed,
                        "outcomes": dict(delivered.outcomes),
                        "lost_races": {"deliver": delivered.lost_races},
                    }
                )
                cleaned = clean_period(ledger, clock, period, CleanupMode.ARCHIVE)
                counts = ledger.state_counts(period)
                drained = all(state in TERMINAL for state in counts)
                emit(
                    {
                        "pass": passes,
                        "step": "clean",
                        "cleaned": cleaned.cleaned,
                        "lost_races": {"cleanup": cleaned.lost_races},
                        "drained": drained,
                    }
                )
                if drained:
                    return 0
                if time.monotonic() >= deadline:
                    left = {s.value: n for s, n in counts.items() if s not in TERMINAL}
                    sys.stderr.write(f"deadline passed with items left: {left}\n")
                    return EXIT_DEADLINE
                busy = delivered.claimed or cleaned.cleaned or sum(reconciled.moved.values())
                if not busy and not recovered.requeued and not recovered.unknown:
                    time.sleep(args.idle_seconds)  # what is left is leased, or not yet due
    finally:
        engine.dispose()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s",
    )
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
