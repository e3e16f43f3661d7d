"""The `digest` command: the operator's and analyst's terminal (design §7).

`main()` is the single error boundary: bad input is one line on stderr and exit code 2, a run or
check that failed is exit code 1, and nothing is written before the input has been validated. A
reader that closes the output early (`digest items … | head`) ends the command quietly with exit
code 141, as a shell reports for a writer killed by SIGPIPE: no traceback, nothing on stderr.
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

from digest_pipeline.adapters.sql.engine import LedgerDatabaseError
from digest_pipeline.cli import (
    audit,
    dead_letters,
    items,
    reconcile,
    regenerate,
    replay,
    resolve,
    rotate_secret,
    run,
    seed,
    serve,
    simulate,
    status,
    suppress,
    sweep,
)
from digest_pipeline.cli.context import (
    EXIT_FAILED,
    EXIT_OUTPUT_CLOSED,
    EXIT_USAGE,
    Context,
    OutputClosed,
    UsageError,
    cli_logging,
    discard_output,
    flush_output,
)
from digest_pipeline.component.layered_env import instance_env
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
    parser.add_argument(
        "--instance",
        metavar="NAME",
        help="the WeeklyDigest instance of the project's code location (workspace.yaml) to work "
        "on: its YAML's settings over the environment's (default: the environment's alone)",
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
        regenerate,
        sweep,
        audit,
        suppress,
        rotate_secret,
        serve,
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
    """Runs one command; returns its exit code (0 ok, 1 failed, 2 bad input, 141 output closed)."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        args = build_parser().parse_args(argv)
    except UsageError as e:
        err.write(f"digest: error: {e}\n")
        return EXIT_USAGE
    except SystemExit as e:  # --help has printed and asked to exit
        try:
            # argparse prints help to sys.stdout whatever `out` is
            flush_output(sys.stdout)
        except OutputClosed:
            discard_output(sys.stdout)
            return EXIT_OUTPUT_CLOSED
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    base = env if env is not None else os.environ
    ctx = Context(base, root or Path.cwd(), out, err)
    if clock is not None:
        ctx.clock = clock
    try:
        args.digest = None
        if args.instance is not None:
            # Dagster and the graph load only for a named instance
            from digest_pipeline.cli.instances import instance_spec

            args.digest = instance_spec(ctx.root, args.instance)
            ctx.env = instance_env(args.digest.settings, base)
        # the services' `event=… key=…` lines go to stderr at DIGEST_LOG_LEVEL, then detach
        with cli_logging(ctx):
            code: int = args.handler(ctx, args)
        ctx.flush()
        return code
    except OutputClosed:
        # The Python docs' recipe for SIGPIPE: the reader has what it wanted; the command stops
        # at its next line (its ledger work, as every step, is resumable) and exits quietly.
        discard_output(out)
        return EXIT_OUTPUT_CLOSED
    except DigestError as e:
        err.write(f"digest {args.command}: error: {e}\n")
        return EXIT_USAGE
    except SQLAlchemyError as e:
        # One line, not a traceback. A ledger engine's errors are one safe line already (the
        # statement, the driver's cause, a few keys); any other SQLAlchemy error is cut to its
        # driver's first line, since its own text goes on with the SQL and its parameters.
        if isinstance(e, LedgerDatabaseError):
            first = str(e)
        else:
            first = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
        err.write(f"digest {args.command}: error: the ledger database failed: {first}\n")
        return EXIT_FAILED
    finally:
        ctx.close()
