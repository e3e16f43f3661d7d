"""`digest audit`: who moved which item, from which state to which, and why.

Operators' resolutions and replays and the reconciler's moves are each one row, written in the
same transaction as the move itself.
"""

import argparse
from typing import Any

from digest_pipeline.cli.context import (
    EXIT_OK,
    Context,
    emit_json,
    iso,
    parse_period,
    printable_row,
    table,
    when,
)
from digest_pipeline.domain.model import AuditEntry

HEADER = ("at", "actor", "action", "key", "from -> to", "reason")


def register(sub: Any) -> None:
    """Adds `digest audit`."""
    p = sub.add_parser(
        "audit",
        help="the audit trail: resolutions, replays and reconciliations",
        description="List audit rows, oldest first: time, actor, action, operation key, the "
        "state move and the reason given.",
    )
    p.add_argument("--period", help="only this period (2026-W42, 2026-10-12 or latest)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(handler=run_audit)


def row(e: AuditEntry) -> tuple[object, ...]:
    """One audit row as table cells, in HEADER's order."""
    move = f"{e.from_state or '-'} -> {e.to_state or '-'}"
    # one line per row, whatever an older version stored: control characters escaped
    return printable_row((when(e.at), e.actor, e.action, e.key or "-", move, e.reason))


def as_json(e: AuditEntry) -> dict[str, object]:
    """One audit row for `--json`."""
    return {
        "at": iso(e.at),
        "actor": e.actor,
        "action": e.action,
        "key": str(e.key) if e.key else None,
        "period": str(e.period) if e.period else None,
        "from_state": e.from_state,
        "to_state": e.to_state,
        "reason": e.reason,
    }


def run_audit(ctx: Context, args: argparse.Namespace) -> int:
    """Prints the audit rows, of one period or all."""
    period = parse_period(ctx, args.period) if args.period else None
    entries = ctx.ledger.audit_log(period)
    if args.json:
        scope = str(period) if period else None
        emit_json(ctx, {"period": scope, "audit": [as_json(e) for e in entries]})
        return EXIT_OK
    scope = f"period {period}" if period else "all periods"
    ctx.write(f"{scope}: {len(entries)} audit rows (times in UTC)")
    ctx.write()
    table(ctx, [row(e) for e in entries], HEADER)
    return EXIT_OK
