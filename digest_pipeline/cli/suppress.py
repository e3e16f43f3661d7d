"""`digest suppress`, `digest unsuppress` and `digest suppressions`: the operator's suppression list.

Both changes are audited (the operator, the reason) and idempotent: suppressing a customer on
the list already, or unsuppressing one not on it, changes nothing and says so (exit 0).
"""

import argparse
from typing import Any

from digest_pipeline.adapters.sql.feedback import SqlFeedbackStore
from digest_pipeline.cli.context import (
    EXIT_OK,
    Context,
    add_operator_argument,
    emit_json,
    iso,
    require_operator,
    require_reason,
)
from digest_pipeline.domain.feedback import Suppression
from digest_pipeline.services.suppress import (
    SuppressReport,
    suppress_customer,
    unsuppress_customer,
)


def register(sub: Any) -> None:
    """Adds `digest suppress`, `digest unsuppress` and `digest suppressions`."""
    for name, helps, handler in (
        (
            "suppress",
            "stop every future digest to one customer (audited)",
            run_suppress,
        ),
        (
            "unsuppress",
            "take one customer off the suppression list (audited)",
            run_unsuppress,
        ),
    ):
        p = sub.add_parser(
            name,
            help=helps,
            description=f"{helps[0].upper()}{helps[1:]}. Later weeks' snapshots follow the "
            "list; a suppression also cancels the customer's items whose attempt has not started, "
            "of every week, to `suppressed`. Items already cancelled stay so when unsuppressed.",
        )
        p.add_argument("--customer", required=True, help="the customer id, e.g. customer-1842")
        p.add_argument("--reason", required=True, help="why: recorded in the audit row")
        add_operator_argument(p)
        p.add_argument("--json", action="store_true", help="print JSON instead of a line")
        p.set_defaults(handler=handler)
    p = sub.add_parser(
        "suppressions",
        help="list the suppressed customers",
        description="The suppression list: customer id, reason, source and time; no address.",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of lines")
    p.set_defaults(handler=run_suppressions)


def _row(s: Suppression) -> dict[str, str | None]:
    return {
        "customer_id": s.customer_id,
        "reason": s.reason.value,
        "source": s.source,
        "created_at": iso(s.created_at),
    }


def _report(ctx: Context, args: argparse.Namespace, report: SuppressReport, did: str) -> int:
    if args.json:
        emit_json(
            ctx,
            {
                "customer_id": report.customer_id,
                "changed": report.changed,
                "suppression": None if report.standing is None else _row(report.standing),
            },
        )
        return EXIT_OK
    if report.changed:
        ctx.write(f"{report.customer_id}: {did}")
    elif report.standing is not None:
        s = report.standing
        ctx.write(
            f"{report.customer_id}: already suppressed ({s.reason.value}, {s.source}, "
            f"{iso(s.created_at)}); nothing changed"
        )
    else:
        ctx.write(f"{report.customer_id}: not suppressed; nothing changed")
    return EXIT_OK


def _store(ctx: Context) -> SqlFeedbackStore:
    return SqlFeedbackStore(ctx.engine, ctx.ledger.instance)


def run_suppress(ctx: Context, args: argparse.Namespace) -> int:
    """Suppresses the customer and prints what stands."""
    operator = require_operator(ctx, args.operator)
    report = suppress_customer(
        _store(ctx), ctx.clock, args.customer, require_reason(args.reason), operator
    )
    return _report(ctx, args, report, f"suppressed by {operator}; unclaimed items cancelled")


def run_unsuppress(ctx: Context, args: argparse.Namespace) -> int:
    """Unsuppresses the customer and prints what stands."""
    operator = require_operator(ctx, args.operator)
    report = unsuppress_customer(
        _store(ctx), ctx.clock, args.customer, require_reason(args.reason), operator
    )
    return _report(ctx, args, report, f"unsuppressed by {operator}; later weeks select them")


def run_suppressions(ctx: Context, args: argparse.Namespace) -> int:
    """Prints the list, by customer id."""
    listed = _store(ctx).suppressions()
    if args.json:
        emit_json(ctx, [_row(s) for s in listed])
        return EXIT_OK
    for s in listed:
        ctx.write(f"{s.customer_id}  {s.reason.value}  {s.source}  {iso(s.created_at)}")
    if not listed:
        ctx.write("no suppressed customers")
    return EXIT_OK
