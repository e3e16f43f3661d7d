"""`digest resolve`: an operator settles one `unknown` item as sent or not sent; audited.

`sent` lets cleanup proceed; `not-sent` schedules a resend with the same operation key, due now.
Any other state is refused and nothing changes. The audit row records the operator and reason.
"""

import argparse
from typing import Any

from digest_pipeline.cli.context import (
    EXIT_OK,
    Context,
    UsageError,
    add_operator_argument,
    emit_json,
    iso,
    require_operator,
    require_reason,
)
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.services.resolve import resolve_unknown

OUTCOMES = {"sent": True, "not-sent": False}


def register(sub: Any) -> None:
    """Adds `digest resolve`."""
    p = sub.add_parser(
        "resolve",
        help="settle one unknown item as sent or not-sent (audited)",
        description="Resolve an unknown item on the operator's evidence (e.g. the provider's "
        "logs): sent lets cleanup proceed, not-sent resends it with the same key on the next "
        "digest sweep or sensor run. Only unknown items can be resolved.",
    )
    p.add_argument("--key", required=True, help="the operation key, digest:2026-W42:<customer>")
    p.add_argument(
        "--as",
        dest="outcome",
        required=True,
        metavar="sent|not-sent",
        help="sent: the provider has it; not-sent: resend it with the same key",
    )
    p.add_argument("--reason", required=True, help="why: recorded in the audit row")
    add_operator_argument(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a line")
    p.set_defaults(handler=run_resolve)


def run_resolve(ctx: Context, args: argparse.Namespace) -> int:
    """Resolves the item and prints its new state."""
    key = OperationKey.parse(args.key)
    if args.outcome not in OUTCOMES:
        raise UsageError(f"--as {args.outcome!r} must be sent or not-sent")
    operator = require_operator(ctx, args.operator)
    item = resolve_unknown(
        ctx.ledger,
        ctx.clock,
        key,
        sent=OUTCOMES[args.outcome],
        reason=require_reason(args.reason),
        operator=operator,
    )
    if args.json:
        emit_json(
            ctx,
            {
                "key": str(key),
                "state": item.state,
                "operator": operator,
                "next_attempt_at": iso(item.next_attempt_at),
            },
        )
        return EXIT_OK
    ctx.write(f"{key}: unknown -> {item.state} (resolved by {operator})")
    if item.state is DeliveryState.SENT:
        ctx.write("cleanup of its rows follows on the next digest sweep or run")
    else:
        ctx.write("the next digest sweep or sensor run resends it with the same operation key")
    return EXIT_OK
