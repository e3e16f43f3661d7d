"""`digest status`: a period's counts by state, its invariants and its metrics, from the ledger.

Its figures are the ones the Dagster UI shows on the week's assets, under the same names and
roundings (`PeriodMetrics.as_flat_dict`, `content_totals`). A week that may not start now (a
missed week: its delivery window closed before any attempt) is named with the line a run of it
would be refused with. It also recounts, from the customer source as it is now, the eligible customers the snapshot
leaves out (an invalid id, an address over 320 characters): they are never sent a digest, and
nothing else shows them. Invalid ids are counted, never printed; such an id may hold anything.
"""

import argparse
from typing import Any

from digest_pipeline import wiring
from digest_pipeline.cli.context import (
    EXIT_FAILED,
    EXIT_OK,
    Context,
    add_period_argument,
    emit_json,
    parse_period,
    table,
)
from digest_pipeline.domain.model import MAX_ADDRESS_LENGTH
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.services import period_gate
from digest_pipeline.services.metrics import content_totals, period_metrics
from digest_pipeline.services.snapshot import count_exclusions

#: figures printed above the metrics table: the period and the state counts
_NOT_METRICS = frozenset({"period", *(s.value for s in DeliveryState)})


def register(sub: Any) -> None:
    """Adds `digest status`."""
    p = sub.add_parser(
        "status",
        help="counts by state, invariant results and metrics of one period",
        description="Read one period's state from the ledger. Exit code 1 when an invariant "
        "fails, so scripts and alerts can use it.",
    )
    add_period_argument(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(handler=run_status)


def run_status(ctx: Context, args: argparse.Namespace) -> int:
    """Prints the period's state; exit 1 if an invariant fails."""
    period = parse_period(ctx, args.period)
    ledger, now = ctx.ledger, ctx.now()
    metrics = period_metrics(ledger, period, now)
    week = metrics.as_flat_dict() | content_totals(ledger, period, metrics.eligible)
    invariants = ledger.check_invariants(period, now)
    ok = all(r.passed for r in invariants)
    excluded = count_exclusions(wiring.build_customer_source(ctx.settings, ctx.engine))
    # the line a run of the week would be refused with now (a missed week), or None
    missed = period_gate.refusal(ledger, ctx.settings.policy, period, now)
    if args.json:
        emit_json(
            ctx,
            {
                "period": str(period),
                "missed": missed,
                "by_state": metrics.by_state,
                "invariants": {
                    r.name: {"passed": r.passed, "violations": r.violations, "sample": r.sample}
                    for r in invariants
                },
                "metrics": {
                    **week,
                    # recounted from the source now: eligible customers the snapshot leaves out
                    "left_out_invalid_ids": excluded.invalid_ids,
                    "left_out_long_addresses": excluded.long_addresses,
                    "left_out_long_address_ids": list(excluded.long_address_ids),
                },
                "dead_letters": metrics.dead_letters,
            },
        )
        return EXIT_OK if ok else EXIT_FAILED
    ctx.write(f"period {period} (partition {period.partition_key}), eligible {metrics.eligible}")
    if missed is not None:
        ctx.write(f"MISSED: {missed}")
    if excluded.total:
        sample = f" ({', '.join(excluded.long_address_ids)})" if excluded.long_addresses else ""
        ctx.write(
            f"left out (source now): {excluded.invalid_ids} invalid customer ids, "
            f"{excluded.long_addresses} addresses over {MAX_ADDRESS_LENGTH} characters{sample}"
        )
    ctx.write()
    # every state, 0 included: the counts add up to work_items
    table(ctx, [(s.value, week[s.value]) for s in DeliveryState], ("state", "items"))
    ctx.write()
    table(
        ctx,
        [
            (r.name, "pass" if r.passed else "FAIL", r.violations, " ".join(r.sample))
            for r in invariants
        ],
        ("invariant", "result", "violations", "sample keys"),
    )
    ctx.write()
    # every other figure the JSON and the UI show, by the same name
    shown = [(k, "-" if v is None else v) for k, v in week.items() if k not in _NOT_METRICS]
    table(ctx, shown, ("metric", "value"))
    return EXIT_OK if ok else EXIT_FAILED
