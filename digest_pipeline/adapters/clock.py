"""The real clock: the one place that reads the system time, always as UTC."""

from collections.abc import Callable
from datetime import UTC, datetime

from digest_pipeline.ports import Clock


class SystemClock(Clock):
    """`datetime.now(UTC)`."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def recipe(self) -> "Callable[[], Clock]":
        return SystemClock
