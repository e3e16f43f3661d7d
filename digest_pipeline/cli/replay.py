"""`digest replay`: reopen a bounded, named set of dead-lettered or failed keys of one period.

Keys are named one by one (`--key`, repeatable) or in a file (`--keys-file`), never by a query,
so replaying everything at once is impossible by design; more than 100 keys needs `--max-keys`.
The whole request is checked before anything changes, each key is reconciled first, and every
reopened key is audited with the operator and reason. A key an earlier attempt may already have
delivered (its outcome was `unknown`, and nothing since says it was not delivered) refuses the
whole request unless `--accept-possible-duplicate` is given; `--dry-run` shows that attempt.
Replay only reopens: the next `digest sweep` or sensor run delivers.
"""

import argparse
from pathlib import Path
from typing import Any

from digest_pipeline.cli.context import (
    EXIT_OK,
    Context,
    UsageError,
    add_operator_argument,
    add_period_argument,
    ascii_int,
    emit_json,
    parse_period,
    require_operator,
    require_reason,
    table,
)
from digest_pipeline.cli.files import read_input
from digest_pipeline.domain.errors import InvalidOperationKey, PossibleDuplicateRefused
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.services.replay import (
    DEFAULT_REPLAY_CAP,
    ReplayLine,
    ReplayReport,
    replay_keys,
)


def register(sub: Any) -> None:
    """Adds `digest replay`."""
    p = sub.add_parser(
        "replay",
        help="reopen named dead-lettered or failed keys of one period (bounded, audited)",
        description="Replay dead-lettered or failed keys of one period, named with --key "
        "(repeatable) or --keys-file. The request is refused as a whole, with nothing changed, "
        "if any key is of another period, unknown, or not dead-lettered or failed, or if there "
        f"are more than {DEFAULT_REPLAY_CAP} keys (raise with --max-keys). Each key is "
        "reconciled first: one with evidence of delivery is left alone. A key an earlier attempt "
        "may have delivered (outcome unknown, no later evidence it was not) is a possible "
        "duplicate: the request is refused unless --accept-possible-duplicate is given. "
        "Replayed keys are delivered by the next digest sweep or sensor run.",
    )
    add_period_argument(p)
    p.add_argument(
        "--key", action="append", dest="keys", metavar="K", help="an operation key (repeatable)"
    )
    p.add_argument(
        "--keys-file",
        metavar="F",
        help="a file with one operation key per line (blank lines and # comments ignored)",
    )
    p.add_argument("--reason", required=True, help="why: recorded in each audit row")
    add_operator_argument(p)
    p.add_argument("--dry-run", action="store_true", help="show the plan per key; change nothing")
    p.add_argument(
        "--accept-possible-duplicate",
        action="store_true",
        help="replay keys an earlier attempt may already have delivered (the customer may get "
        "a second copy); recorded in each such key's audit row",
    )
    p.add_argument(
        "--max-keys",
        type=ascii_int,
        metavar="N",
        help=f"the cap on keys in this request (default {DEFAULT_REPLAY_CAP}); must be at least 1",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(handler=run_replay)


def read_keys_file(path: Path) -> list[OperationKey]:
    """The keys of a keys file; an unreadable or oversized file or a bad line is one line."""
    text = read_input(path, "--keys-file")
    keys = []
    for number, line in enumerate(text.splitlines(), start=1):
        entry = line.split("#", 1)[0].strip()  # keys never hold '#'
        if not entry:
            continue
        try:
            keys.append(OperationKey.parse(entry))
        except InvalidOperationKey as e:
            raise UsageError(f"--keys-file {path} line {number}: {e}") from e
    return keys


def _requested_keys(args: argparse.Namespace) -> list[OperationKey]:
    if args.keys and args.keys_file is not None:
        raise UsageError("name keys with --key or with --keys-file, not both")
    if args.keys_file is not None:
        return read_keys_file(Path(args.keys_file))
    if not args.keys:
        raise UsageError("name the keys to replay: --key K [--key K ...] or --keys-file F")
    return [OperationKey.parse(k) for k in args.keys]


def as_json(report: ReplayReport, cap: int, operator: str) -> dict[str, object]:
    """The plan (or what was done) per key, for `--json`."""
    return {
        "period": str(report.period),
        "dry_run": report.dry_run,
        "cap": cap,
        "operator": operator,
        "replayed": report.replayed,
        "accept_possible_duplicate": report.accepted_possible_duplicate,
        "possible_duplicates": [str(k) for k in report.possible_duplicates],
        "keys": [
            {
                "key": str(line.key),
                "state": line.state,
                "plan": line.plan,
                "evidence": line.evidence,
                "possible_send": _possible_send_json(line),
            }
            for line in report.lines
        ],
    }


def _possible_send_json(line: ReplayLine) -> dict[str, object] | None:
    ps = line.possible_send
    if ps is None:
        return None
    return {
        "attempt": ps.number,
        "outcome": ps.outcome,
        "started_at": ps.started_at.isoformat(),
        "detail": ps.detail,
        "provider_message_id": ps.provider_message_id,
    }


def _evidence_text(line: ReplayLine) -> str:
    ps = line.possible_send
    return line.evidence if ps is None else f"{line.evidence}; {ps.describe()}"


def run_replay(ctx: Context, args: argparse.Namespace) -> int:
    """Checks the request, then replays (or, with --dry-run, shows the plan)."""
    period = parse_period(ctx, args.period)
    keys = _requested_keys(args)
    cap = DEFAULT_REPLAY_CAP if args.max_keys is None else args.max_keys
    if cap < 1:
        raise UsageError(f"--max-keys must be at least 1, not {cap}")
    operator = require_operator(ctx, args.operator)
    try:
        report = replay_keys(
            ctx.ledger,
            ctx.mailer,
            ctx.clock,
            period,
            keys,
            operator=operator,
            reason=require_reason(args.reason),
            dry_run=args.dry_run,
            cap=cap,
            accept_possible_duplicate=args.accept_possible_duplicate,
        )
    except PossibleDuplicateRefused as e:
        raise UsageError(
            f"replay refused, nothing changed: {len(e.keys)} key(s) may already have been "
            f"delivered: {', '.join(e.keys)}; --dry-run shows the attempt, and "
            "--accept-possible-duplicate replays them anyway (a second copy is possible)"
        ) from e
    if args.json:
        emit_json(ctx, as_json(report, cap, operator))
        return EXIT_OK
    verb = "would replay" if report.dry_run else "replayed"
    ctx.write(f"period {period}: {verb} {report.replayed} of {len(report.lines)} keys")
    ctx.write()
    table(
        ctx,
        [(line.key, line.state, line.plan, _evidence_text(line)) for line in report.lines],
        ("key", "state", "plan", "evidence"),
    )
    ctx.write()
    doubtful = len(report.possible_duplicates)
    if doubtful and report.accepted_possible_duplicate:
        ctx.write(
            f"{doubtful} possible duplicate(s) accepted by {operator}: the customer may get a "
            "second copy; the audit row says so"
        )
    elif doubtful:
        ctx.write(
            f"{doubtful} possible duplicate(s): an earlier attempt may have delivered them; "
            "without --accept-possible-duplicate the replay is refused"
        )
    if report.dry_run:
        ctx.write("dry run: nothing changed; run again without --dry-run to replay")
    else:
        ctx.write(
            f"reopened as pending by {operator}; the next digest sweep or sensor run delivers them"
        )
    return EXIT_OK
