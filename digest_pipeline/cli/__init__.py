"""The `digest` command: the operator's and analyst's terminal (design §7).

`main()` is the single error boundary: bad input is one line on stderr and exit code 2, a run or
check that failed is exit code 1, and nothing is written before the input has been validated.
It reads the same `DIGEST_*` variables as the Dagster resources, and shows the services' log
lines on stderr at `DIGEST_LOG_LEVEL` (default WARNING).
"""

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn, TextIO

from sqlalchemy.exc import SQLAlchemyError

from digest_pipeline.cli import (
    audit,
    dead_letters,
    items,
    reconcile,
    replay,
    resolve,
    run,
    seed,
    simulate,
    status,
    sweep,
)
from digest_pipeline.cli.context import EXIT_FAILED, EXIT_USAGE, Context, UsageError, cli_logging
from digest_pipeline.domain.errors import DigestError
from digest_pipeline.ports import Clock


class _Parser(argparse.ArgumentParser):
    """Turns argparse's usage-and-exit into a UsageError, so main prints one line to `err`."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def build_parser() -> argparse.ArgumentParser:
    """The `digest` parser with one subcommand per module."""
    parser = _Parser(
        prog="digest", description="Deliver and inspect the weekly digest, one period at a time."
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )
    for module in (
        seed,
        run,
        status,
        items,
        dead_letters,
        reconcile,
        resolve,
        replay,
        sweep,
        audit,
        simulate,
    ):
        module.register(sub)
    return parser


def main(
    argv: Sequence[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    root: Path | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    clock: Clock | None = None,
) -> int:
    """Runs one command; returns its exit code (0 ok, 1 failed, 2 bad input)."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        args = build_parser().parse_args(argv)
    except UsageError as e:
        err.write(f"digest: error: {e}\n")
        return EXIT_USAGE
    except SystemExit as e:  # --help has printed and asked to exit
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    ctx = Context(env if env is not None else os.environ, root or Path.cwd(), out, err)
    if clock is not None:
        ctx.clock = clock
    try:
        # the services' `event=… key=…` lines go to stderr at DIGEST_LOG_LEVEL, then detach
        with cli_logging(ctx):
            code: int = args.handler(ctx, args)
        return code
    except DigestError as e:
        err.write(f"digest {args.command}: error: {e}\n")
        return EXIT_USAGE
    except SQLAlchemyError as e:
        # One line, not a traceback; the driver's first line names the cause (never the password).
        first = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
        err.write(f"digest {args.command}: error: the ledger database failed: {first}\n")
        return EXIT_FAILED
    finally:
        ctx.close()
