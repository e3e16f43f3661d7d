"""`digest reconcile`: settle a period's `unknown` items now, on evidence only (design §2).

It asks the ledger, then the configured mailer (about the attempts that mailer made: one that
another mailer made is left alone, and a line says which mailer it needs); what has no evidence
stays `unknown` for `digest resolve`, and each move is audited as `system:reconcile` with its
evidence.
"""

import argparse
from typing import Any

from digest_pipeline.cli.context import (
    EXIT_OK,
    Context,
    add_period_argument,
    emit_json,
    parse_period,
    table,
)
from digest_pipeline.domain.periods import Period
from digest_pipeline.services.reconcile import ReconcileReport, reconcile_period


def register(sub: Any) -> None:
    """Adds `digest reconcile`."""
    p = sub.add_parser(
        "reconcile",
        help="settle one period's unknown items now, with the configured mailer's evidence",
        description="Reconcile the period's unknown items: a confirmed attempt in the ledger, "
        "then the mailer's lookup or idempotent resend. Items without evidence stay unknown; "
        "resolve them with digest resolve.",
    )
    add_period_argument(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(handler=run_reconcile)


def as_json(report: ReconcileReport) -> dict[str, object]:
    """The report's counts and every change, for `--json` (here and in `digest sweep`)."""
    return {
        "examined": report.examined,
        "moved": dict(sorted(report.moved.items())),
        "evidence": dict(sorted(report.evidence.items())),
        "still_unknown": report.still_unknown,
        "needs_mailer": dict(sorted(report.needs_mailer.items())),
        "lost_races": report.lost_races,
        "changes": [{"key": str(k), "state": s, "evidence": e} for k, s, e in report.changes],
    }


def needs_mailer_lines(period: Period, report: ReconcileReport, mailer: str) -> list[str]:
    """One line per mailer the period's left-alone items need (here and in `digest sweep`)."""
    return [
        f"period {period}: {n} unknown item(s) left alone: an attempt that may have delivered "
        f"was made through mailer {needed}, not this one ({mailer}); reconcile with that mailer, "
        "or digest resolve --key K --as sent|not-sent --reason TEXT"
        for needed, n in sorted(report.needs_mailer.items())
    ]


def run_reconcile(ctx: Context, args: argparse.Namespace) -> int:
    """Reconciles the period's unknown items and prints what moved."""
    period = parse_period(ctx, args.period)
    settings = ctx.settings
    report = reconcile_period(ctx.ledger, ctx.mailer, ctx.clock, settings.policy, period)
    if args.json:
        emit_json(
            ctx,
            {
                "period": str(period),
                "mailer": settings.mailer,
                "mailer_identity": ctx.mailer.identity,
                **as_json(report),
            },
        )
        return EXIT_OK
    ctx.write(
        f"period {period}: {report.examined} unknown items examined "
        f"(mailer {settings.mailer}, {ctx.mailer.identity})"
    )
    ctx.write()
    if report.changes:
        table(ctx, [(k, s, e) for k, s, e in report.changes], ("key", "new state", "evidence"))
        ctx.write()
    counts = [(f"moved to {s}", n) for s, n in sorted(report.moved.items())]
    counts += [("still unknown", report.still_unknown), ("lost races", report.lost_races)]
    table(ctx, counts, ("result", "items"))
    for line in needs_mailer_lines(period, report, ctx.mailer.identity):
        ctx.write()
        ctx.write(line)
    if report.still_unknown > sum(report.needs_mailer.values()):
        ctx.write()
        ctx.write(
            f"{report.still_unknown} items have no evidence either way: check the provider, then "
            "digest resolve --key K --as sent|not-sent --reason TEXT"
        )
    return EXIT_OK
