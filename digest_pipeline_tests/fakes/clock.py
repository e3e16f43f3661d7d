"""The tests' clock: time moves only when a test moves it, and is always timezone-aware UTC."""

import threading
from datetime import datetime, timedelta

from digest_pipeline.ports.outside import Clock


def require_utc(t: datetime, what: str) -> datetime:
    """`t`, refused unless it is timezone-aware UTC, as every time the core handles must be."""
    if t.tzinfo is None or t.utcoffset() != timedelta(0):
        raise ValueError(f"{what} must be timezone-aware UTC, got {t!r}")
    return t


class FixedClock(Clock):
    """A clock that moves only when the test says so."""

    def __init__(self, start: datetime) -> None:
        self._now = require_utc(start, "start")
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, delta: timedelta) -> datetime:
        """Moves time forward by `delta` (never backwards: use `set` for that); returns now."""
        if delta < timedelta(0):
            raise ValueError(f"a clock only advances; got {delta}")
        with self._lock:
            self._now = self._now + delta
            return self._now

    def set(self, t: datetime) -> None:
        """Jumps to `t` (timezone-aware UTC)."""
        require_utc(t, "t")
        with self._lock:
            self._now = t
