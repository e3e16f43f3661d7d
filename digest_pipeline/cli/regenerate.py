"""`digest regenerate`: rebuild the digest rows of a period's never-sent items after a fix.

For a catalogue row that broke digests: fix the product, then regenerate, then replay. Only items
that were never sent (pending, retry_scheduled, failed, dead_lettered) are touched, and of those
only the ones whose rows change; the ledger refuses, per key and in the same transaction, any
item claimed, sent or `unknown` meanwhile. No state changes, so nothing is sent by this command:
failed and dead-lettered keys go out after `digest replay`, the others on their next attempt.
One audit row per run names the operator and the reason.
"""

import argparse
from typing import Any

from digest_pipeline import wiring
from digest_pipeline.cli.context import (
    EXIT_OK,
    Context,
    UsageError,
    add_operator_argument,
    add_period_argument,
    emit_json,
    parse_period,
    require_operator,
    require_reason,
    table,
)
from digest_pipeline.services.regenerate import RegenerateReport, regenerate_period


def register(sub: Any) -> None:
    """Adds `digest regenerate`."""
    p = sub.add_parser(
        "regenerate",
        help="rebuild the digest rows of a period's never-sent items from the current catalogue",
        description="Regenerate the digest rows of every item of the period that was never sent "
        "(pending, retry_scheduled, failed, dead_lettered) and whose rows differ from what the "
        "current catalogue gives, e.g. after fixing a product that broke the digests. Items "
        "claimed, sent, cleaned or unknown are never touched. No item changes state: replay the "
        "failed and dead-lettered keys afterwards with digest replay. Audited.",
    )
    add_period_argument(p)
    p.add_argument("--reason", required=True, help="why: recorded in the audit row")
    add_operator_argument(p)
    p.add_argument("--dry-run", action="store_true", help="count what would change; change nothing")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(handler=run_regenerate)


def as_json(report: RegenerateReport, operator: str) -> dict[str, object]:
    """What was (or would be) regenerated, for `--json`: counts, product ids and keys only."""
    return {
        "period": str(report.period),
        "dry_run": report.dry_run,
        "operator": operator,
        "considered": {s.value: n for s, n in sorted(report.considered.items())},
        "regenerated": report.regenerated,
        "unchanged": report.unchanged,
        "changed_meanwhile": report.changed_meanwhile,
        "rows": report.rows,
        "without_picks": report.without_picks,
        "excluded_products": [
            {"product_id": b.product_id, "fields": list(b.fields)} for b in report.excluded
        ],
        "to_replay": report.to_replay,
        "to_replay_sample": [str(k) for k in report.to_replay_sample],
    }


def run_regenerate(ctx: Context, args: argparse.Namespace) -> int:
    """Checks the request, then regenerates (or, with --dry-run, counts)."""
    period = parse_period(ctx, args.period)
    if not require_reason(args.reason).strip():
        raise UsageError("--reason must say why")
    operator = require_operator(ctx, args.operator)
    report = regenerate_period(
        wiring.build_customer_source(ctx.settings, ctx.engine),
        ctx.ledger,
        ctx.clock,
        period,
        operator=operator,
        reason=args.reason,
        dry_run=args.dry_run,
        picks_rule=ctx.settings.shop.picks_rule,
    )
    if args.json:
        emit_json(ctx, as_json(report, operator))
        return EXIT_OK
    verb = "would regenerate" if report.dry_run else "regenerated"
    considered = sum(report.considered.values())
    ctx.write(f"period {period}: {verb} {report.regenerated} of {considered} never-sent items")
    ctx.write()
    table(
        ctx,
        [
            *((f"never sent: {s.value}", n) for s, n in sorted(report.considered.items())),
            ("unchanged", report.unchanged),
            ("changed meanwhile (left alone)", report.changed_meanwhile),
            ("rows written" if not report.dry_run else "rows to write", report.rows),
            ("without picks", report.without_picks),
            ("to replay (failed, dead_lettered)", report.to_replay),
        ],
        ("items", "count"),
    )
    if report.excluded:
        ctx.write()
        table(
            ctx,
            [(b.product_id, ", ".join(b.fields)) for b in report.excluded],
            ("excluded product", "fields"),
        )
    ctx.write()
    if report.dry_run:
        ctx.write("dry run: nothing changed; run again without --dry-run to regenerate")
    elif report.to_replay:
        more = report.to_replay - len(report.to_replay_sample)
        ctx.write(f"replay these with digest replay --period {period} (reconciled first):")
        for key in report.to_replay_sample:
            ctx.write(f"  {key}")
        if more:
            ctx.write(f"  … and {more} more (digest items --period {period} --state failed)")
    return EXIT_OK
