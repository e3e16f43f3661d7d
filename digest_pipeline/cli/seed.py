"""`digest seed`: realistic demo source data, and optionally a period's frozen selection and rows."""

import argparse
import uuid
from typing import Any

from digest_pipeline import wiring
from digest_pipeline.adapters.demo_data import seed_demo
from digest_pipeline.cli.context import (
    EXIT_OK,
    Context,
    UsageError,
    ascii_int,
    parse_period,
    table,
)
from digest_pipeline.runtime.executor import executor_for
from digest_pipeline.services.content import generate_content
from digest_pipeline.services.snapshot import take_snapshot
from digest_pipeline.source_settings import require_demo_source

MAX_CUSTOMERS = 10_000_000


def register(sub: Any) -> None:
    """Adds `digest seed`."""
    p = sub.add_parser(
        "seed",
        help="create demo customers, catalogue and orders (idempotent for the same --seed)",
        description="Create realistic demo source data in DIGEST_DATABASE_URL. With --period, "
        "also freeze that period's eligibility and generate its digest rows, exactly as the "
        "eligibility_snapshot and digest_content assets do.",
    )
    p.add_argument(
        "--customers", type=ascii_int, required=True, help="how many customers (1 or more)"
    )
    p.add_argument("--seed", type=ascii_int, default=7, help="random seed (default 7)")
    p.add_argument("--period", help="also freeze and generate this period (2026-W42 or latest)")
    p.set_defaults(handler=run_seed)


def run_seed(ctx: Context, args: argparse.Namespace) -> int:
    """Seeds the demo data (and the period, with --period)."""
    ctx.creates_ledger = True
    if not 1 <= args.customers <= MAX_CUSTOMERS:
        raise UsageError(f"--customers must be between 1 and {MAX_CUSTOMERS}")
    period = parse_period(ctx, args.period) if args.period else None
    require_demo_source(ctx.settings.source)
    report = seed_demo(ctx.engine, customers=args.customers, seed=args.seed, now=ctx.now())
    table(
        ctx,
        [
            ("customers", report.customers),
            ("inactive", report.inactive),
            ("not opted in", report.not_opted_in),
            ("invalid addresses", report.invalid_addresses),
            ("products", report.products),
            ("orders", report.orders),
        ],
        ("seeded", "count"),
    )
    if period is not None:
        source, ledger = wiring.build_customer_source(ctx.settings, ctx.engine), ctx.ledger
        snap = take_snapshot(
            source,
            ledger,
            ctx.clock,
            period,
            run_id=f"cli-seed-{uuid.uuid4()}",
            executor=executor_for(ledger),
        )
        content = generate_content(
            source,
            ledger,
            period,
            executor=executor_for(ledger),
            picks_rule=ctx.settings.shop.picks_rule,
        )
        ctx.write()
        table(
            ctx,
            [
                ("eligible", snap.eligible),
                ("snapshot", "reused" if snap.reused else "frozen now"),
                ("digest rows", content.rows),
                ("customers with rows already", content.skipped_existing),
            ],
            (str(period), ""),
        )
    return EXIT_OK
