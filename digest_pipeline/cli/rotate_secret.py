"""`digest rotate-secret`: the one audited way to change the unsubscribe secret a ledger recorded.

The new secret comes from `DIGEST_UNSUBSCRIBE_SECRET` and the replaced one from
`DIGEST_UNSUBSCRIBE_SECRET_PREVIOUS`, never from the command line; links the replaced one signed
stay valid for `--overlap-weeks` (services/link_secrets.py holds the rules and their reasons).
"""

import argparse
from datetime import timedelta
from typing import Any

from digest_pipeline.cli.context import (
    EXIT_OK,
    Context,
    UsageError,
    add_operator_argument,
    ascii_int,
    require_operator,
    require_reason,
    when,
)
from digest_pipeline.domain.fingerprints import DEFAULT_OVERLAP, MAX_OVERLAP_WEEKS, shown
from digest_pipeline.services.link_secrets import PREVIOUS, SECRET, rotate_secret

DEFAULT_OVERLAP_WEEKS = DEFAULT_OVERLAP.days // 7


def register(sub: Any) -> None:
    """Adds `digest rotate-secret`."""
    p = sub.add_parser(
        "rotate-secret",
        help="record a new unsubscribe secret (audited; old links stay valid for an overlap)",
        description=f"Record {SECRET} as the secret that signs unsubscribe links, replacing the "
        f"one the ledger recorded, which {PREVIOUS} must hold: links it signed stay valid "
        "for --overlap-weeks. Then restart digest serve (with both variables) and whatever "
        "runs deliveries (with the new secret).",
    )
    p.add_argument("--reason", required=True, help="why the secret changes (kept in the audit)")
    add_operator_argument(p)
    p.add_argument(
        "--overlap-weeks",
        type=ascii_int,
        default=DEFAULT_OVERLAP_WEEKS,
        help=f"weeks links signed with the replaced secret stay valid (0 to {MAX_OVERLAP_WEEKS}, "
        f"default {DEFAULT_OVERLAP_WEEKS}; 0 ends them now and needs no {PREVIOUS})",
    )
    p.set_defaults(handler=run_rotate_secret)


def run_rotate_secret(ctx: Context, args: argparse.Namespace) -> int:
    """Rotates the recorded secret and says what to restart."""
    if not 0 <= args.overlap_weeks <= MAX_OVERLAP_WEEKS:
        raise UsageError(
            f"--overlap-weeks must be between 0 and {MAX_OVERLAP_WEEKS}, got {args.overlap_weeks}"
        )
    reason = require_reason(args.reason)
    actor = require_operator(ctx, args.operator)
    settings = ctx.settings
    rotation = rotate_secret(
        ctx.ledger,
        settings.unsubscribe_secret,
        settings.unsubscribe_secret_previous,
        timedelta(weeks=args.overlap_weeks),
        ctx.clock.now(),
        actor=actor,
        reason=reason,
    )
    before = None if rotation.before is None else rotation.before.current
    after = rotation.after
    ctx.write(f"unsubscribe secret rotated: fingerprint {shown(before)} -> {shown(after.current)}")
    if after.previous_until is not None:
        ctx.write(
            f"links signed with the replaced secret are accepted until {when(after.previous_until)}"
            f": run digest serve with {PREVIOUS} set to it until then"
        )
    else:
        ctx.write("links signed with the replaced secret are no longer accepted")
    ctx.write(f"restart digest serve and the delivery processes with the new {SECRET}")
    return EXIT_OK
