"""The `digest` command: the operator's and analyst's terminal (design §7).

`main()` is the single error boundary: bad input is one line on stderr and exit code 2, a run or
check that failed is exit code 1, and nothing is written before the input has been validated.
It reads the same `DIGEST_*` variables as the Dagster resources.
"""

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

from digest_pipeline.cli import run, seed, status
from digest_pipeline.cli.context import EXIT_USAGE, Context
from digest_pipeline.domain.errors import DigestError
from digest_pipeline.ports import Clock


def build_parser() -> argparse.ArgumentParser:
    """The `digest` parser with one subcommand per module."""
    parser = argparse.ArgumentParser(
        prog="digest", description="Deliver and inspect the weekly digest, one period at a time."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (seed, run, status):
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
    except SystemExit as e:  # argparse has already printed its usage line
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    ctx = Context(env if env is not None else os.environ, root or Path.cwd(), out, err)
    if clock is not None:
        ctx.clock = clock
    try:
        code: int = args.handler(ctx, args)
        return code
    except DigestError as e:
        err.write(f"digest {args.command}: error: {e}\n")
        return EXIT_USAGE
    finally:
        ctx.close()
