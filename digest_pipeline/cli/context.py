"""What every `digest` command shares: the lazily built context, period parsing and output.

It also holds the operator check of `resolve` and `replay`, the worker `sweep` builds, and the
CLI's log handler: the services' `event=… key=…` lines on stderr, at `DIGEST_LOG_LEVEL`.
"""

import argparse
import getpass
import json
import logging
import os
import re
import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TextIO

from sqlalchemy import Engine

from digest_pipeline import wiring
from digest_pipeline.adapters.clock import SystemClock
from digest_pipeline.adapters.sql.engine import create_ledger_engine, migrate
from digest_pipeline.adapters.sql.identity import missing_sqlite_file
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.domain.errors import DigestError
from digest_pipeline.domain.periods import FIRST_PERIOD, Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.operators import MAX_ACTOR, MAX_OPERATOR, MAX_REASON, operator_grants
from digest_pipeline.ports import Clock, Mailer
from digest_pipeline.services.deliver import Deliverer
from digest_pipeline.settings import InvalidSetting, Settings, load_settings
from digest_pipeline.wiring import build_composer, build_mailer

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
    #: set by the commands that may start a new ledger (`digest seed`, `digest run`); every
    #: other command opens only an existing one and refuses a missing SQLite file
    creates_ledger: bool = False
    _settings: Settings | None = None
    _engine: Engine | None = None
    _mailer: Mailer | None = None
    _ledger: SqlLedger | None = None
    _now: datetime | None = None

    def now(self) -> datetime:
        """The command's instant: the clock read once, on first use, then the same answer.

        `latest` and the delivery-window check both ask it, so a command that runs across
        midnight (or any period boundary) still acts on one period, checked at one time.
        """
        if self._now is None:
            self._now = self.clock.now()
        return self._now

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = load_settings(self.env, self.root)
        return self._settings

    @property
    def engine(self) -> Engine:
        """The migrated ledger database, opened on first use.

        A missing SQLite file is refused, before any file or folder is made, unless
        `creates_ledger` is set.
        """
        if self._engine is None:
            url = self.settings.database_url
            if not self.creates_ledger and (path := missing_sqlite_file(url)) is not None:
                raise UsageError(
                    f"no ledger at {path.absolute()}; run digest seed or digest run first"
                )
            self._engine = create_ledger_engine(url, create=self.creates_ledger)
            migrate(self._engine)
        return self._engine

    @property
    def ledger(self) -> SqlLedger:
        """The ledger of `DIGEST_INSTANCE`, which it records or is checked against on first use.

        Raises:
            LedgerMismatch: the ledger belongs to another digest instance.
        """
        if self._ledger is None:
            # the clock, not `now()`: dating the ledger's identity must not fix the command's instant
            self._ledger = wiring.ledger_on(
                self.engine, self.settings.instance, now=self.clock.now()
            )
        return self._ledger

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
    """The week that has ended most recently at the command's instant (`Context.now`)."""
    return Period.of((ctx.now() - timedelta(days=7)).date())


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
        raise UsageError(f"period {period} is before {FIRST_PERIOD}, the first week any run has")
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


def os_user() -> str:
    """The login name of the process's effective uid: who is really acting.

    Not `getpass.getuser()`, which believes `$LOGNAME`/`$USER` and so is as self-asserted as
    `--operator`. A uid without a passwd entry (a container's arbitrary uid) is `uid:1000680000`.
    """
    try:
        import pwd
    except ImportError:  # not POSIX: the login name is the best there is
        try:
            return getpass.getuser()
        except (KeyError, OSError) as e:
            raise UsageError("cannot tell which OS user is acting") from e
    uid = os.geteuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # no passwd entry for the uid: the uid itself is who it is
        return f"uid:{uid}"


#: Unicode categories that must never reach a terminal raw: controls (ESC, CR, DEL, C1), format
#: characters (bidi overrides, zero-width), line and paragraph separators and lone surrogates.
_UNPRINTABLE = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def _unprintable(ch: str) -> bool:
    return unicodedata.category(ch) in _UNPRINTABLE


def _first_unprintable(text: str) -> str | None:
    return next((f"U+{ord(ch):04X}" for ch in text if _unprintable(ch)), None)


def printable(value: object) -> str:
    r"""`str(value)` with every control or format character escaped as `\x1b` / `\u202e`.

    For table cells of rows that older versions stored unchecked: an operator's `--reason` with
    ESC or CR must not repaint the terminal of whoever reads `digest audit` later.
    """
    text = str(value)
    if text.isascii() and text.isprintable():
        return text
    out = []
    for ch in text:
        if not _unprintable(ch):
            out.append(ch)
        elif ord(ch) <= 0xFF:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return "".join(out)


def printable_row(cells: Sequence[object]) -> tuple[str, ...]:
    """`printable` over every cell of one table row."""
    return tuple(printable(c) for c in cells)


def _refuse_unprintable(flag: str, text: str) -> None:
    bad = _first_unprintable(text)
    if bad is not None:
        raise UsageError(
            f"{flag} holds a control or format character ({bad}); give one line of plain text"
        )


def require_reason(text: str | None, flag: str = "--reason") -> str:
    """A reason as typed, refused (exit 2) if it holds control characters or is overlong.

    One line of printable text, so the audit row reads the same on every terminal. An empty
    reason passes through: each service refuses it in its own words.
    """
    if text is None:
        return ""
    _refuse_unprintable(flag, text)
    if len(text) > MAX_REASON:
        raise UsageError(f"{flag} is {len(text)} characters; at most {MAX_REASON}")
    return text


def require_operator(ctx: Context, name: str | None) -> str:
    """Who is acting, as the audit's actor: `alice`, or `alice (os:bob)` for a claimed name.

    The OS user (the effective uid's login name) is the default and is always recorded: a
    `--operator` that is not the OS user is refused unless `DIGEST_OPERATORS` grants that OS
    user the name (`alice=bob`), and is then recorded as `alice (os:bob)`. When
    `DIGEST_OPERATORS` lists names, anyone else is refused. A name with control characters is
    refused (exit 2).
    """
    user = os_user()
    if name is not None:
        _refuse_unprintable("--operator", name)
        name = name.strip()
        if not name:
            raise UsageError("--operator must name someone")
        if len(name) > MAX_OPERATOR:
            raise UsageError(f"--operator is {len(name)} characters; at most {MAX_OPERATOR}")
    claimed = user if name is None else name
    grants = operator_grants(ctx.settings.operators)
    if grants and claimed not in grants:
        raise UsageError(
            f"operator {claimed!r} may not act: DIGEST_OPERATORS allows only "
            f"{', '.join(sorted(grants))}"
        )
    if claimed == user:
        return user
    if user not in grants.get(claimed, frozenset()):
        raise UsageError(
            f"operator {claimed!r} is not the OS user {user!r}: act as yourself (drop --operator) "
            f"or let {user} act as {claimed} with DIGEST_OPERATORS={claimed}={user}"
        )
    actor = f"{claimed} (os:{user})"
    if len(actor) > MAX_ACTOR:
        raise UsageError(f"operator {claimed!r} as OS user {user!r} is too long to audit")
    return actor


def ascii_int(text: str) -> int:
    """An argparse `type` for integers: ASCII digits only, with an optional leading minus.

    `int()` also takes U+FF13 (a full-width 3), `1_000` and surrounding spaces; the periods
    (`2026-W42`) refuse such spellings, so integer arguments do too.
    """
    if not _ASCII_INT.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number in ASCII digits")
    return int(text)


_ASCII_INT = re.compile(r"-?[0-9]+")


def build_deliverer(ctx: Context, owner: str) -> Deliverer:
    """A delivery worker from the settings, as the Dagster delivery step builds one."""
    return wiring.build_deliverer(
        ledger=ctx.ledger,
        mailer=ctx.mailer,
        composer=build_composer(ctx.settings, ctx.clock),
        clock=ctx.clock,
        policy=ctx.settings.policy,
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
