"""`digest dead-letters`: a period's dead-letter rows, the candidates for `digest replay`.

A row holds the operation key, the reason and the counts and times of the item when it stopped;
never an address or digest content.
"""

import argparse
from typing import Any

from digest_pipeline.cli.context import (
    EXIT_OK,
    Context,
    add_period_argument,
    emit_json,
    iso,
    parse_period,
    printable_row,
    table,
    when,
)
from digest_pipeline.domain.model import DeadLetterRecord

HEADER = (
    "key",
    "customer",
    "reason",
    "last failure",
    "attempts",
    "first attempt",
    "last attempt",
    "created",
    "replayed",
)


def register(sub: Any) -> None:
    """Adds `digest dead-letters`."""
    p = sub.add_parser(
        "dead-letters",
        help="the dead-letter rows of one period (what digest replay can reopen)",
        description="List the period's dead-letter rows, oldest first: items that failed "
        "permanently or hit a retry bound. Replay a few of them with digest replay.",
    )
    add_period_argument(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(handler=run_dead_letters)


def row(d: DeadLetterRecord) -> tuple[object, ...]:
    """One dead-letter row as table cells, in HEADER's order."""
    return printable_row(
        (
            d.key,
            d.key.customer_id,
            d.reason,
            d.last_failure_class or "-",
            d.attempts,
            when(d.first_attempt_at),
            when(d.last_attempt_at),
            when(d.created_at),
            when(d.replayed_at),
        )
    )


def as_json(d: DeadLetterRecord) -> dict[str, object]:
    """One dead-letter row for `--json`."""
    return {
        "key": str(d.key),
        "customer_id": d.key.customer_id,
        "reason": d.reason,
        "last_failure_class": d.last_failure_class,
        "attempts": d.attempts,
        "first_attempt_at": iso(d.first_attempt_at),
        "last_attempt_at": iso(d.last_attempt_at),
        "created_at": iso(d.created_at),
        "replayed_at": iso(d.replayed_at),
    }


def run_dead_letters(ctx: Context, args: argparse.Namespace) -> int:
    """Prints the period's dead-letter rows."""
    period = parse_period(ctx, args.period)
    rows = ctx.ledger.dead_letters(period)
    if args.json:
        emit_json(ctx, {"period": str(period), "dead_letters": [as_json(d) for d in rows]})
        return EXIT_OK
    ctx.write(f"period {period}: {len(rows)} dead-letter rows (times in UTC)")
    ctx.write()
    table(ctx, [row(d) for d in rows], HEADER)
    return EXIT_OK
