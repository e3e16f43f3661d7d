"""`digest items`: one line per work item of a period, or with `--key` one item's whole story.

The story is the item, every attempt (worker, fencing token, outcome, provider message id), its
dead-letter rows and its audit rows: enough to answer "did this customer get it, and how many
times?" without opening the database. Never an address or digest content.
"""

import argparse
from typing import Any

from digest_pipeline.cli import audit, dead_letters
from digest_pipeline.cli.context import (
    EXIT_OK,
    Context,
    UsageError,
    add_period_argument,
    emit_json,
    iso,
    parse_period,
    parse_state,
    printable,
    printable_row,
    table,
    when,
)
from digest_pipeline.domain.model import Attempt, WorkItem
from digest_pipeline.domain.periods import OperationKey, Period

HEADER = (
    "key",
    "customer",
    "state",
    "attempts",
    "last failure",
    "detail",
    "first attempt",
    "last attempt",
    "next attempt",
    "lease owner",
    "lease expires",
)
ATTEMPT_HEADER = (
    "#",
    "token",
    "worker",
    "started",
    "finished",
    "outcome",
    "detail",
    "provider message id",
    "duplicate",
)


def register(sub: Any) -> None:
    """Adds `digest items`."""
    p = sub.add_parser(
        "items",
        help="one line per work item of a period, or one item's story with --key",
        description="List a period's work items: key, customer id, state, attempts, last "
        "failure class and detail code, attempt times and lease. With --key, one item with "
        "every attempt, its dead-letter rows and its audit rows. Times are UTC.",
    )
    add_period_argument(p)
    p.add_argument("--state", help="only items in this state (e.g. unknown, retry_scheduled)")
    p.add_argument("--key", help="one operation key of the period: its attempts and audit rows")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(handler=run_items)


def row(i: WorkItem) -> tuple[object, ...]:
    """One item as table cells, in HEADER's order."""
    return printable_row(
        (
            i.key,
            i.customer_id,
            i.state,
            i.attempts,
            i.last_failure_class or "-",
            i.last_detail or "-",
            when(i.first_attempt_at),
            when(i.last_attempt_at),
            when(i.next_attempt_at),
            i.lease_owner or "-",
            when(i.lease_expires_at),
        )
    )


def as_json(i: WorkItem) -> dict[str, object]:
    """One item for `--json`."""
    return {
        "key": str(i.key),
        "customer_id": i.customer_id,
        "state": i.state,
        "attempts": i.attempts,
        "last_failure_class": i.last_failure_class,
        "last_detail": i.last_detail,
        "first_attempt_at": iso(i.first_attempt_at),
        "last_attempt_at": iso(i.last_attempt_at),
        "next_attempt_at": iso(i.next_attempt_at),
        "lease_owner": i.lease_owner,
        "lease_expires_at": iso(i.lease_expires_at),
        "provider_message_id": i.provider_message_id,
        "sent_at": iso(i.sent_at),
        "cleaned_at": iso(i.cleaned_at),
        "replayed_at": iso(i.replayed_at),
    }


def attempt_row(a: Attempt) -> tuple[object, ...]:
    """One attempt as table cells, in ATTEMPT_HEADER's order."""
    return printable_row(
        (
            a.number,
            a.token,
            a.worker,
            when(a.started_at),
            when(a.finished_at),
            a.outcome or "open",
            a.detail or "-",
            a.provider_message_id or "-",
            "yes" if a.duplicate else "no",
        )
    )


def attempt_json(a: Attempt) -> dict[str, object]:
    """One attempt for `--json`."""
    return {
        "number": a.number,
        "token": a.token,
        "worker": a.worker,
        "started_at": iso(a.started_at),
        "finished_at": iso(a.finished_at),
        "outcome": a.outcome,
        "detail": a.detail,
        "provider_message_id": a.provider_message_id,
        "duplicate": a.duplicate,
    }


def _key_of_period(text: str, period: Period) -> OperationKey:
    key = OperationKey.parse(text)
    if key.period != period:
        raise UsageError(f"--key {key} is not of period {period}")
    return key


def run_items(ctx: Context, args: argparse.Namespace) -> int:
    """Prints the period's items, or one item's story."""
    period = parse_period(ctx, args.period)
    state = parse_state(args.state) if args.state is not None else None
    if args.key is not None:
        if state is not None:
            raise UsageError("--key shows one item whatever its state; drop --state")
        return _story(ctx, _key_of_period(args.key, period), args.json)
    found = ctx.ledger.items(period, None if state is None else [state])
    if args.json:
        emit_json(
            ctx, {"period": str(period), "state": state, "items": [as_json(i) for i in found]}
        )
        return EXIT_OK
    scope = f" in state {state}" if state is not None else ""
    ctx.write(f"period {period}: {len(found)} items{scope} (times in UTC)")
    ctx.write()
    table(ctx, [row(i) for i in found], HEADER)
    return EXIT_OK


def _story(ctx: Context, key: OperationKey, as_json_output: bool) -> int:
    ledger = ctx.ledger
    item = ledger.get(key)
    if item is None:
        raise UsageError(f"no work item for {key}")
    tried = ledger.attempts(key)
    letters = [d for d in ledger.dead_letters(key.period) if d.key == key]
    entries = [e for e in ledger.audit_log(key.period) if e.key == key]
    if as_json_output:
        emit_json(
            ctx,
            {
                "period": str(key.period),
                "item": as_json(item),
                "attempts": [attempt_json(a) for a in tried],
                "dead_letters": [dead_letters.as_json(d) for d in letters],
                "audit": [audit.as_json(e) for e in entries],
            },
        )
        return EXIT_OK
    ctx.write(f"{key} (times in UTC)")
    ctx.write()
    fields = [
        *zip(HEADER, row(item), strict=True),
        ("provider message id", printable(item.provider_message_id or "-")),
        ("sent", when(item.sent_at)),
        ("cleaned", when(item.cleaned_at)),
        ("replayed", when(item.replayed_at)),
    ]
    table(ctx, fields, ("field", "value"))
    for title, header, rows in (
        (f"attempts: {len(tried)}", ATTEMPT_HEADER, [attempt_row(a) for a in tried]),
        (
            f"dead letters: {len(letters)}",
            dead_letters.HEADER,
            list(map(dead_letters.row, letters)),
        ),
        (f"audit: {len(entries)}", audit.HEADER, [audit.row(e) for e in entries]),
    ):
        ctx.write()
        ctx.write(title)
        if rows:
            table(ctx, rows, header)
    return EXIT_OK
