"""One sender's side of the install's pace: wait for a slot, heed the provider, see a long pause.

`Pacer.send` wraps each send of a delivery worker: it takes the next slot of the shared budget
(`DIGEST_SEND_RATE`) and waits for it, and after the provider's answer records the pause a rate
limit or a spent quota asks of every sender (domain/pacing.py).
"""

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.pacing import (
    QUOTA_PAUSE,
    Pause,
    held_back,
    pause_after,
    slot_interval,
    wait_bound,
)
from digest_pipeline.ports import Clock, SendBudget
from digest_pipeline.services.logs import log_event

#: without a rate, a sender reads the shared pause at most this often: another process's pause
#: reaches it within this time, and an unpaced run costs no statement per send
PAUSE_READ_EVERY = timedelta(seconds=1)


@dataclass
class Pacer:
    """The pace of one worker's sends through one mailer; safe to call from its pool threads."""

    budget: SendBudget
    mailer: str
    #: messages per second for the whole install; None: unpaced, only pauses are honoured
    rate: float | None
    clock: Clock
    lease: timedelta
    sleep: Callable[[float], None] = time.sleep
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: the pause last read or made here, and when it was read
    _pause: Pause | None = field(default=None, repr=False)
    _read_at: datetime | None = field(default=None, repr=False)

    def send(self, transmit: Callable[[], SendOutcome]) -> SendOutcome:
        """Waits for the send's slot, sends, and heeds the answer.

        A pause or a backlog longer than the wait bound keeps the send from leaving, and so does
        a budget that cannot be read: the outcome says so, and nothing reached the provider.
        """
        now = self.clock.now()
        horizon = now + wait_bound(self.lease)
        try:
            at, pause = self._slot(now, horizon)
        except Exception as e:
            log_event("pacing_unavailable", logging.WARNING, error=type(e).__name__)
            return SendOutcome.failed(FailureClass.TRANSIENT, "paced:budget_unavailable")
        if at is None or at > horizon:
            if pause is None or pause.until <= horizon:
                pause = Pause(horizon, "paced:backlog")
            return held_back(pause, now)
        if (wait := (at - now).total_seconds()) > 0:
            self.sleep(wait)
        return self.heed(transmit())

    def _slot(self, now: datetime, horizon: datetime) -> tuple[datetime | None, Pause | None]:
        """When the send may leave (None: not before the horizon) and the pause in force."""
        if self.rate is not None:
            at, pause = self.budget.take_slot(self.mailer, slot_interval(self.rate), now, horizon)
            self._remember(pause, now)
            return at, pause
        pause = self.pause_in_force(now)
        if pause is None:
            return now, None
        return (pause.until if pause.until <= horizon else None), pause

    def heed(self, outcome: SendOutcome) -> SendOutcome:
        """Records the pause the outcome asks of every sender; a quota gets its pause as its wait."""
        now = self.clock.now()
        pause = pause_after(outcome, now)
        if pause is None:
            return outcome
        self._remember(pause, now)
        try:
            self.budget.pause(self.mailer, pause)
        except Exception as e:
            # the answer is what matters: this worker pauses, the others learn of it from
            # their own throttled answers
            log_event("pause_unrecorded", logging.WARNING, error=type(e).__name__)
        log_event("sending_paused", until=pause.until.isoformat(), why=pause.why)
        if outcome.quota and outcome.retry_after is None:
            return replace(outcome, retry_after=QUOTA_PAUSE)
        return outcome

    def pause_in_force(self, now: datetime) -> Pause | None:
        """The install's pause at `now`, read from the budget at most every `PAUSE_READ_EVERY`."""
        with self._lock:
            fresh = self._read_at is not None and now < self._read_at + PAUSE_READ_EVERY
            known = self._pause
        if not fresh:
            known = self.budget.current_pause(self.mailer)
            self._remember(known, now)
        return known if known is not None and known.until > now else None

    def long_pause(self, now: datetime) -> Pause | None:
        """The pause in force past what a send may wait for: the run stops claiming, or None."""
        pause = self.pause_in_force(now)
        return pause if pause is not None and pause.until > now + wait_bound(self.lease) else None

    def _remember(self, pause: Pause | None, now: datetime) -> None:
        with self._lock:
            if pause is None or self._pause is None or pause.until >= self._pause.until:
                self._pause = pause
            self._read_at = now
