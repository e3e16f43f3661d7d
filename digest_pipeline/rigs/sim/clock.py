"""The simulator's virtual clock: the `Clock` port, moved only by the scheduler.

Production code never reads the tests' `FixedClock`; this is the simulator's own, and it refuses
to go backwards so a scheduling bug cannot silently reorder the ledger's history.
"""

from datetime import datetime, timedelta

from digest_pipeline.ports import Clock


class VirtualClock(Clock):
    """Virtual UTC time that only the scheduler advances."""

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None or start.utcoffset() != timedelta(0):
            raise ValueError(f"the virtual clock starts at a UTC time, got {start!r}")
        self._now = start

    def now(self) -> datetime:
        return self._now

    def set(self, t: datetime) -> None:
        """Moves to `t`, which may not be earlier than now."""
        if t < self._now:
            raise ValueError(f"virtual time cannot go back from {self._now} to {t}")
        self._now = t
