"""`digest simulate`: the fault-injection and load harness, on virtual time, seeded.

Every input is checked before any cell runs (one line, exit 2). The table goes to stdout and
depends only on the inputs, so the same `--seed` prints the same bytes; the wall time goes to
stderr. Exit code 1 when any design §4 invariant failed in any cell. The grid's code (and
pandas) is imported only when the command runs, so the rest of `digest` stays quick to start.
"""

import argparse
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from digest_pipeline.cli.context import EXIT_FAILED, EXIT_OK, Context, UsageError
from digest_pipeline.domain.errors import InvalidPolicy
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.retry import RetryPolicy
from digest_pipeline.rigs.sim.config import MAX_CUSTOMERS, FaultMix, SimConfig

RETRY = RetryPolicy()
FAULTS = FaultMix()
DEFAULTS = SimConfig(customers=1)


def _number(check: Callable[[float], bool], what: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number; {what}") from None
        if not check(value) or value != value:  # NaN fails every check but this one
            raise argparse.ArgumentTypeError(f"{text!r}: {what}")
        return value

    return parse


RATE = _number(lambda v: 0.0 <= v <= 1.0, "must be between 0 and 1")
POSITIVE = _number(lambda v: 0.0 < v < float("inf"), "must be a positive number")
NON_NEGATIVE = _number(lambda v: 0.0 <= v < float("inf"), "must be 0 or more")


def _whole(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least {least}")
    return value


def _positive_int(text: str) -> int:
    return _whole(text, 1)


def _int_list(text: str) -> tuple[int, ...]:
    """`1,4,16`: whole numbers of at least 1, each once."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() for p in parts) or any(int(p) < 1 for p in parts):
        raise argparse.ArgumentTypeError(
            f"{text!r}: must be comma-separated whole numbers of at least 1, like 1,4,16"
        )
    values = tuple(int(p) for p in parts)
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"{text!r}: lists a value twice")
    return values


def _csv(values: tuple[int, ...]) -> str:
    return ",".join(str(v) for v in values)


def register(sub: Any) -> None:
    """Adds `digest simulate`."""
    p = sub.add_parser(
        "simulate",
        help="fault-injection and load simulation on virtual time (deterministic per --seed)",
        description="Deliver one simulated period per grid cell (workers x lease) through the "
        "real delivery, reconciliation, lease-recovery and cleanup services and a fresh real "
        "ledger, against an in-process provider that injects the failure mix, an outage and "
        "crashes, on virtual time. Prints one column of numbers per cell, read from the "
        "provider's store and the ledger, with every design invariant as pass/fail. The same "
        "--seed prints the same table. Exit code 1 when an invariant failed.",
    )
    add = p.add_argument
    add("--customers", type=_positive_int, required=True, help="customers in the period")
    add("--seed", type=int, default=DEFAULTS.seed, help=f"random seed (default {DEFAULTS.seed})")
    add(
        "--database-url",
        help="a scratch PostgreSQL database (must be empty; truncated between cells); "
        "default: a temporary SQLite file per cell",
    )
    rates = p.add_argument_group("failure mix (per send unless noted; between 0 and 1)")
    for flag, default, what in (
        ("--transient-rate", FAULTS.transient_rate, "503: retry later"),
        ("--throttle-rate", FAULTS.throttle_rate, "429 with Retry-After"),
        ("--permanent-rate", FAULTS.permanent_rate, "per customer: a suppressed recipient"),
        (
            "--timeout-after-accept-rate",
            FAULTS.timeout_after_accept_rate,
            "accepted, but the answer never arrives",
        ),
        (
            "--crash-after-send-rate",
            FAULTS.crash_after_send_rate,
            "accepted, then the worker dies before recording it",
        ),
        (
            "--crash-after-cleanup-commit-rate",
            FAULTS.crash_after_cleanup_commit_rate,
            "per key: cleanup commits, its acknowledgement is lost, the step runs again",
        ),
        (
            "--duplicate-delivery-rate",
            FAULTS.duplicate_delivery_rate,
            "per claim: redelivered to a second worker as its lease runs out",
        ),
    ):
        rates.add_argument(flag, type=RATE, default=default, help=f"{what} (default {default:g})")
    rates.add_argument(
        "--outage-start",
        type=NON_NEGATIVE,
        default=FAULTS.outage_start.total_seconds() / 60,
        metavar="MINUTES",
        help="minutes after the delivery starts when every send begins to be refused "
        f"(default {FAULTS.outage_start.total_seconds() / 60:g})",
    )
    rates.add_argument(
        "--outage-minutes",
        type=NON_NEGATIVE,
        default=FAULTS.outage_length.total_seconds() / 60,
        metavar="M",
        help=f"how long the outage lasts; 0 for none "
        f"(default {FAULTS.outage_length.total_seconds() / 60:g})",
    )
    rates.add_argument(
        "--provider-idempotent",
        action=argparse.BooleanOptionalAction,
        default=FAULTS.provider_idempotent,
        help="whether the provider deduplicates a repeated idempotency key for 24 h "
        "(default: it does)",
    )
    rates.add_argument(
        "--send-latency-ms",
        type=POSITIVE,
        default=FAULTS.send_latency.total_seconds() * 1000,
        metavar="MS",
        help=f"virtual time one send takes (default {FAULTS.send_latency.total_seconds() * 1000:g})",
    )
    grid = p.add_argument_group("the grid and the bounds under test")
    grid.add_argument(
        "--workers",
        type=_int_list,
        default=DEFAULTS.workers,
        help=f"worker counts to sweep (default {_csv(DEFAULTS.workers)})",
    )
    grid.add_argument(
        "--lease-seconds",
        type=_int_list,
        default=DEFAULTS.lease_seconds,
        help=f"leases (visibility timeouts) to sweep (default {_csv(DEFAULTS.lease_seconds)})",
    )
    grid.add_argument(
        "--no-jitter",
        action="store_true",
        help="also run every cell without jitter (each delay is its bound), side by side",
    )
    grid.add_argument(
        "--retry-base-seconds",
        type=POSITIVE,
        default=RETRY.base.total_seconds(),
        help=f"default {RETRY.base.total_seconds():g}",
    )
    grid.add_argument(
        "--retry-cap-seconds",
        type=POSITIVE,
        default=RETRY.cap.total_seconds(),
        help=f"default {RETRY.cap.total_seconds():g}",
    )
    grid.add_argument(
        "--max-attempts",
        type=_positive_int,
        default=RETRY.max_attempts,
        help=f"default {RETRY.max_attempts}",
    )
    grid.add_argument(
        "--max-age-seconds",
        type=POSITIVE,
        default=RETRY.max_age.total_seconds(),
        help=f"default {RETRY.max_age.total_seconds():g}",
    )
    grid.add_argument(
        "--batch-size",
        type=_positive_int,
        default=DEFAULTS.batch_size,
        help="items one worker claims at a time and sends one after another "
        f"(default {DEFAULTS.batch_size}; a delivery step claims 8 x DIGEST_CONCURRENCY at a time)",
    )
    grid.add_argument(
        "--sweep-seconds",
        type=POSITIVE,
        default=DEFAULTS.sweep_interval.total_seconds(),
        help="how often unknown items are reconciled and sent items cleaned "
        f"(default {DEFAULTS.sweep_interval.total_seconds():g}: the sensor's interval)",
    )
    out = p.add_argument_group("output")
    out.add_argument("--json", type=Path, metavar="FILE", help="also write the results as JSON")
    out.add_argument("--csv", type=Path, metavar="FILE", help="also write the results as CSV")
    out.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help="also draw duplicates, drain time and retry-wake spikes (needs the plot extra)",
    )
    out.add_argument(
        "--jobs",
        type=_positive_int,
        help="processes running cells at once (default: up to 2 for SQLite, 1 for PostgreSQL); "
        "the output does not depend on it",
    )
    p.set_defaults(handler=run_simulate)


def _seconds(value: float) -> timedelta:
    return timedelta(seconds=value)


def build_config(args: argparse.Namespace) -> SimConfig:
    """The validated inputs; every problem is a one-line error naming the flag."""
    if args.customers > MAX_CUSTOMERS:
        raise UsageError(f"--customers must be between 1 and {MAX_CUSTOMERS}")
    try:
        retry = RetryPolicy(
            base=_seconds(args.retry_base_seconds),
            cap=_seconds(args.retry_cap_seconds),
            max_attempts=args.max_attempts,
            max_age=_seconds(args.max_age_seconds),
        )
    except InvalidPolicy as e:
        raise UsageError(f"retry bounds: {e}") from e
    faults = FaultMix(
        transient_rate=args.transient_rate,
        throttle_rate=args.throttle_rate,
        permanent_rate=args.permanent_rate,
        timeout_after_accept_rate=args.timeout_after_accept_rate,
        crash_after_send_rate=args.crash_after_send_rate,
        crash_after_cleanup_commit_rate=args.crash_after_cleanup_commit_rate,
        duplicate_delivery_rate=args.duplicate_delivery_rate,
        outage_start=timedelta(minutes=args.outage_start),
        outage_length=timedelta(minutes=args.outage_minutes),
        provider_idempotent=args.provider_idempotent,
        send_latency=timedelta(milliseconds=args.send_latency_ms),
    )
    return SimConfig(
        customers=args.customers,
        seed=args.seed,
        faults=faults,
        policy=DeliveryPolicy(retry=retry),
        batch_size=args.batch_size,
        sweep_interval=_seconds(args.sweep_seconds),
        workers=args.workers,
        lease_seconds=args.lease_seconds,
        compare_no_jitter=args.no_jitter,
    )


def _check_output(flag: str, path: Path | None, suffix: str | None = None) -> None:
    if path is None:
        return
    if suffix is not None and path.suffix.lower() != suffix:
        raise UsageError(f"{flag} must name a {suffix} file, got {path}")
    if not path.parent.is_dir():
        raise UsageError(f"{flag}: folder {path.parent} does not exist")


def run_simulate(ctx: Context, args: argparse.Namespace) -> int:
    """Runs the grid and prints (and writes) its results."""
    from digest_pipeline.rigs.sim import grid, report  # pandas is imported only here

    config = build_config(args)
    _check_output("--json", args.json)
    _check_output("--csv", args.csv)
    _check_output("--plot", args.plot, ".png")
    if args.plot is not None:
        report.require_plotting()
    jobs = args.jobs if args.jobs is not None else grid.default_jobs(config, args.database_url)
    began = time.monotonic()
    result = grid.run_grid(config, jobs=jobs, database_url=args.database_url)
    elapsed = time.monotonic() - began
    for line in report.render_header(config):
        ctx.write(line)
    ctx.write()
    ctx.write(report.render_table(result.frame))
    ctx.write()
    failing = [c for c in result.cells if not c.ok]
    if failing:
        for c in failing:
            ctx.write(f"invariants FAIL in {c.cell.label}: {c.row['invariant_failures']}")
    else:
        ctx.write(f"invariants: all {len(result.cells[0].invariants)} hold in every cell")
    if args.json is not None:
        report.write_json(result.frame, config, args.json)
    if args.csv is not None:
        report.write_csv(result.frame, args.csv)
    if args.plot is not None:
        report.write_plot(result.frame, args.plot)
    cells = len(result.cells)
    ctx.err.write(
        f"digest simulate: {cells} cell{'s' if cells > 1 else ''} in {elapsed:.1f} s wall time "
        f"({jobs} process{'es' if jobs > 1 else ''})\n"
    )
    return EXIT_OK if not failing else EXIT_FAILED
