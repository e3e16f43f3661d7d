"""What every `digest` command shares: the lazily built context, period parsing and output.

It also holds the operator check of `resolve` and `replay`, the worker `sweep` builds, and the
CLI's log handler: the services' `event=… key=…` lines on stderr, at `DIGEST_LOG_LEVEL`.
"""

import argparse
import getpass
import json
import logging
import os
import random
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TextIO

from sqlalchemy import Engine

from digest_pipeline.adapters.clock import SystemClock
from digest_pipeline.adapters.factory import build_composer, build_mailer
from digest_pipeline.adapters.sql_engine import create_ledger_engine, migrate
from digest_pipeline.adapters.sql_ledger import SqlLedger
from digest_pipeline.domain.errors import DigestError
from digest_pipeline.domain.periods import FIRST_PERIOD, Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.ports import Clock, Mailer
from digest_pipeline.services.deliver import Deliverer
from digest_pipeline.settings import InvalidSetting, Settings, load_settings

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
#: 128 + SIGPIPE: what a shell reports for a writer whose reader left (`yes | head` under
#: `pipefail`). Not 0: the output was cut short, and a script that cares can tell; not 1: nothing
#: failed, the reader simply had enough.
EXIT_OUTPUT_CLOSED = 141
#: what `DIGEST_LOG_LEVEL` accepts (any case); the default keeps routine INFO lines quiet
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
DEFAULT_LOG_LEVEL = "WARNING"
#: characters per write to the output: io.DEFAULT_BUFFER_SIZE, so every slice fits the buffer
_WRITE_SLICE = 8192


class UsageError(DigestError):
    """The command line asked for something that cannot be done."""


class OutputClosed(Exception):
    """The reader of the command's output went away (`digest items | head`).

    Raised only from writes to the command's own output, so a BrokenPipeError from anything
    else (a mailer's socket) stays the error it is instead of passing for a closed stdout.
    """


def flush_output(stream: TextIO) -> None:
    """Flushes `stream`; a reader that has gone away is `OutputClosed`."""
    try:
        stream.flush()
    except BrokenPipeError as e:
        raise OutputClosed(str(e)) from e


def discard_output(stream: TextIO) -> None:
    """Points `stream`'s descriptor at the null device (the Python docs' SIGPIPE recipe).

    The lines still buffered in `stream` are flushed again when the interpreter exits; into the
    closed pipe that would print "Exception ignored … BrokenPipeError" after all.
    """
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # StringIO: no descriptor, nothing to flush
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


@dataclass
class Context:
    """What a command needs, built lazily from the environment (the CLI's composition root)."""

    env: Mapping[str, str]
    root: Path
    out: TextIO
    err: TextIO
    clock: Clock = field(default_factory=SystemClock)
    _settings: Settings | None = None
    _engine: Engine | None = None
    _mailer: Mailer | None = None

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = load_settings(self.env, self.root)
        return self._settings

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = create_ledger_engine(self.settings.database_url)
            migrate(self._engine)
        return self._engine

    @property
    def ledger(self) -> SqlLedger:
        return SqlLedger(self.engine)

    @property
    def mailer(self) -> Mailer:
        """The configured mailer (`DIGEST_MAILER`), built on first use and closed by `close`."""
        if self._mailer is None:
            self._mailer = build_mailer(self.settings)
        return self._mailer

    def write(self, text: str = "") -> None:
        line = text + "\n"
        try:
            # In slices: one large write that the pipe takes in part before its reader leaves
            # comes back short with the EPIPE swallowed (CPython's BufferedWriter), and the
            # rest of `--json` would vanish with exit code 0 instead of 141.
            for start in range(0, len(line), _WRITE_SLICE):
                self.out.write(line[start : start + _WRITE_SLICE])
        except BrokenPipeError as e:
            raise OutputClosed(str(e)) from e

    def flush(self) -> None:
        """Sends the buffered output now, inside `main`'s error boundary, not at exit."""
        flush_output(self.out)

    def close(self) -> None:
        # The SMTP and HTTP mailers hold connections; the outbox has nothing to close.
        if self._mailer is not None:
            self._mailer.close()
        if self._engine is not None:
            self._engine.dispose()


def latest_complete_period(ctx: Context) -> Period:
    """The week that has ended most recently: the one the weekly schedule runs now."""
    return Period.of((ctx.clock.now() - timedelta(days=7)).date())


def add_period_argument(parser: argparse.ArgumentParser) -> None:
    """`--period`, in the spellings `parse_period` accepts."""
    parser.add_argument(
        "--period", required=True, help="2026-W42, its Monday 2026-10-12, or latest"
    )


def add_operator_argument(parser: argparse.ArgumentParser) -> None:
    """`--operator`, which `require_operator` checks against DIGEST_OPERATORS."""
    parser.add_argument(
        "--operator",
        help="who is acting (default: the OS user); DIGEST_OPERATORS limits who may",
    )


def parse_period(ctx: Context, text: str) -> Period:
    """`2026-W42`, its Monday `2026-10-12`, or `latest`; only weeks that have ended."""
    if text == "latest":
        return latest_complete_period(ctx)
    period = Period.parse(text)
    latest = latest_complete_period(ctx)
    if period > latest:
        raise UsageError(f"period {period} has not ended yet; the latest complete one is {latest}")
    if period < FIRST_PERIOD:
        raise UsageError(f"period {period} is before the first partition ({FIRST_PERIOD})")
    return period


def emit_json(ctx: Context, data: object) -> None:
    """Stable, sorted JSON for `--json`."""
    ctx.write(json.dumps(data, indent=2, sort_keys=True, default=str))


def table(ctx: Context, rows: Sequence[tuple[object, ...]], header: tuple[str, ...]) -> None:
    """A plain left-aligned table: readable at 3 a.m., and greppable."""
    cells = [tuple(str(c) for c in header)] + [tuple(str(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for r in cells:
        ctx.write("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def when(t: datetime | None) -> str:
    """A table cell for a time: UTC to the second, or `-`."""
    return "-" if t is None else t.strftime("%Y-%m-%dT%H:%M:%SZ")


def iso(t: datetime | None) -> str | None:
    """A JSON value for a time: full ISO 8601 with its UTC offset, or null."""
    return None if t is None else t.isoformat()


def parse_state(text: str) -> DeliveryState:
    """A state name as stored in the ledger; anything else is a one-line error listing them."""
    names = [s.value for s in DeliveryState]
    if text not in names:
        raise UsageError(f"--state {text!r} is not a state; use one of {', '.join(names)}")
    return DeliveryState(text)


def require_operator(ctx: Context, name: str | None) -> str:
    """Who is acting: `--operator`, else the OS user; refused if `DIGEST_OPERATORS` excludes it."""
    if name is None:
        try:
            name = getpass.getuser()
        except (KeyError, OSError) as e:  # no login name and no passwd entry for the uid
            raise UsageError("cannot tell who is acting; pass --operator NAME") from e
    name = name.strip()
    if not name:
        raise UsageError("--operator must name someone")
    allowed = ctx.settings.operators
    if allowed and name not in allowed:
        raise UsageError(
            f"operator {name!r} may not act: DIGEST_OPERATORS allows only {', '.join(sorted(allowed))}"
        )
    return name


def build_deliverer(ctx: Context, owner: str) -> Deliverer:
    """A delivery worker from the settings, as the Dagster delivery step builds one."""
    settings = ctx.settings
    return Deliverer(
        ledger=ctx.ledger,
        mailer=ctx.mailer,
        composer=build_composer(settings, ctx.clock),
        clock=ctx.clock,
        policy=settings.policy,
        rand=random.Random().random,
        owner=owner,
    )


def log_level(env: Mapping[str, str]) -> int:
    """`DIGEST_LOG_LEVEL` as a `logging` level; a bad value is a one-line error naming it."""
    raw = env.get("DIGEST_LOG_LEVEL", "").strip() or DEFAULT_LOG_LEVEL
    if raw.upper() not in LOG_LEVELS:
        raise InvalidSetting(f"DIGEST_LOG_LEVEL={raw!r}: must be one of {', '.join(LOG_LEVELS)}")
    return logging.getLevelNamesMapping()[raw.upper()]


@contextmanager
def cli_logging(ctx: Context) -> Iterator[None]:
    """The services' structured lines on the command's stderr while it runs, then detached.

    The lines already read `event=… key=…` and carry only keys and codes (services/logs.py).
    """
    level = log_level(ctx.env)
    logger = logging.getLogger("digest_pipeline")
    handler = logging.StreamHandler(ctx.err)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    handler.setLevel(level)
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)
