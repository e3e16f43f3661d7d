"""`digest sweep`: what the sensor's runs do, from the terminal, for every open period.

Recover expired leases, reconcile `unknown` items, deliver due items and retries, clean sent
items: each step is idempotent, so a sweep next to a running sensor or a second sweep is safe.
A refused period (a missed week, a changed snapshot) prints one `refused:` line, a delivery the
circuit breaker stopped one `stopped:` line; either makes the exit status 1.
"""

import argparse
import os
import socket
from typing import Any

from digest_pipeline.cli import reconcile
from digest_pipeline.cli.context import (
    EXIT_FAILED,
    EXIT_OK,
    Context,
    build_deliverer,
    emit_json,
    table,
)
from digest_pipeline.cli.durability import require_durable_ledger
from digest_pipeline.cli.secrets import require_link_settings
from digest_pipeline.services.cleanup import CleanupReport
from digest_pipeline.services.pipeline import SweepReport, sweep


def register(sub: Any) -> None:
    """Adds `digest sweep`."""
    p = sub.add_parser(
        "sweep",
        help="recover leases, reconcile, deliver due items and clean, for every open period",
        description="One pass of what the digest_retry_sweeper sensor's runs do: recover "
        "expired leases, reconcile unknown items, deliver every due item (retries and "
        "replays) with the configured mailer, then clean sent items (DIGEST_CLEANUP_MODE).",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(handler=run_sweep)


def _cleaned_json(c: CleanupReport) -> dict[str, object]:
    return {
        "cleaned": c.cleaned,
        "already_cleaned": c.already_cleaned,
        "rows": c.rows,
        "lost_races": c.lost_races,
        "held_back": dict(sorted(c.held_back.items())),
    }


def as_json(report: SweepReport) -> dict[str, object]:
    """The sweep's report for `--json`."""
    return {
        "recovered": {
            "requeued": [str(k) for k in report.recovered.requeued],
            "unknown": [str(k) for k in report.recovered.unknown],
        },
        "periods": [str(p) for p in report.periods],
        "reconciled": {str(p): reconcile.as_json(r) for p, r in report.reconciled.items()},
        "delivered": {
            "claimed": report.delivered.claimed,
            "by_state": dict(sorted(report.delivered.outcomes.items())),
            "lost_races": report.delivered.lost_races,
        },
        "cleaned": {str(p): _cleaned_json(c) for p, c in report.cleaned.items()},
        "refused": {str(p): why for p, why in report.refused.items()},
        "stopped": report.stopped,
        "released": report.delivered.released,
    }


def run_sweep(ctx: Context, args: argparse.Namespace) -> int:
    """Runs one sweep and prints its report."""
    settings = ctx.settings
    require_durable_ledger(ctx, "digest sweep")
    # lease owners and attempt workers are stored in 128 characters; host names may be longer
    owner = f"cli-sweep:{socket.gethostname()[:64]}:{os.getpid()}"
    # built (its templates checked) before the secret check may record the first fingerprint
    deliverer = build_deliverer(ctx, owner)
    require_link_settings(ctx, "digest sweep")
    report = sweep(
        deliverer,
        batch_size=settings.batch_size,
        concurrency=settings.concurrency,
        cleanup_mode=settings.cleanup_mode,
        breaker_threshold=settings.breaker_threshold,
    )
    # A period left alone, or a delivery the breaker stopped, is not a clean sweep: exit 1, so a
    # cron job's alert fires.
    status = EXIT_FAILED if report.refused or report.stopped else EXIT_OK
    for why in report.refused.values():
        ctx.err.write(f"refused: {why}\n")
    if report.stopped:
        ctx.err.write(f"stopped: {report.stopped}\n")
    if args.json:
        emit_json(ctx, as_json(report))
        return status
    recovered = report.recovered
    ctx.write(
        f"expired leases: {len(recovered.requeued)} requeued, {len(recovered.unknown)} unknown"
    )
    ctx.write(f"open periods: {' '.join(map(str, report.periods)) or 'none'}")
    ctx.write()
    table(
        ctx,
        [
            (
                p,
                r.examined,
                " ".join(f"{s}={n}" for s, n in sorted(r.moved.items())) or "-",
                r.still_unknown,
                report.cleaned[p].cleaned if p in report.cleaned else "-",
            )
            for p, r in report.reconciled.items()
        ],
        ("period", "unknown examined", "reconciled to", "still unknown", "cleaned"),
    )
    ctx.write()
    delivered = report.delivered
    rows = [("claimed", delivered.claimed)]
    rows += [(f"ended {s}", n) for s, n in sorted(delivered.outcomes.items())]
    rows.append(("lost races", delivered.lost_races))
    if delivered.released:
        rows.append(("given back unsent", delivered.released))
    table(ctx, rows, ("delivery", "items"))
    for p, r in report.reconciled.items():
        for line in reconcile.needs_mailer_lines(p, r, ctx.mailer.identity):
            ctx.write(line)
    return status
