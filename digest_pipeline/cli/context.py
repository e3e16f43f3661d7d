"""What every `digest` command shares: the lazily built context, period parsing and output."""

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TextIO

from sqlalchemy import Engine

from digest_pipeline.adapters.clock import SystemClock
from digest_pipeline.adapters.sql_engine import create_ledger_engine, migrate
from digest_pipeline.adapters.sql_ledger import SqlLedger
from digest_pipeline.domain.errors import DigestError
from digest_pipeline.domain.periods import FIRST_PERIOD, Period
from digest_pipeline.ports import Clock
from digest_pipeline.settings import Settings, load_settings

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(DigestError):
    """The command line asked for something that cannot be done."""


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

    def write(self, text: str = "") -> None:
        self.out.write(text + "\n")

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()


def latest_complete_period(ctx: Context) -> Period:
    """The week that has ended most recently: the one the weekly schedule runs now."""
    return Period.of((ctx.clock.now() - timedelta(days=7)).date())


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
