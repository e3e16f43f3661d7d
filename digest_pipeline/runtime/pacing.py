"""One sender's side of the install's pace: wait for a slot, heed the provider, see a long pause.

`Pacer.send` wraps each send of a delivery worker: it takes the next slot of the shared budget
(`DIGEST_SEND_RATE`) and waits for it, and after the provider's answer records the pause a rate
limit or a spent quota asks of every sender (domain/pacing.py).
"""

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from digest_pipeline.domain.errors import SendingPaused
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.pacing import (
    QUOTA_PAUSE,
    Pause,
    held_back,
    paced_concurrency,
    pause_after,
    slot_interval,
    stop_line,
    wait_bound,
)
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.ports.ledger_roles import HasSendBudget, SendBudget
from digest_pipeline.ports.outside import Clock, Mailer
from digest_pipeline.services.logs import step_log

#: without a rate, a sender reads the shared pause at most this often: another process's pause
#: reaches it within this time, and an unpaced run costs no statement per send
PAUSE_READ_EVERY = timedelta(seconds=1)


def pacer_for(
    ledger: HasSendBudget, mailer: Mailer, policy: DeliveryPolicy, clock: Clock
) -> "Pacer | None":
    """The pace of a worker's sends through `mailer`; None for a ledger that keeps no budget."""
    budget = ledger.send_budget
    return None if budget is None else Pacer(budget, mailer, policy.send_rate, clock, policy.lease)


@dataclass
class Pacer:
    """The pace of one worker's sends through one mailer; safe to call from its pool threads."""

    budget: SendBudget
    mailer: Mailer
    #: messages per second for the whole install; None: unpaced, only pauses are honoured
    rate: float | None
    clock: Clock
    lease: timedelta
    sleep: Callable[[float], None] = time.sleep
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: one thread of the process waits for the next slot at a time (`_wait_for_slot`)
    _gate: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: when the next slot is free, as the last take told; read and written under `_gate`
    _free_at: datetime | None = field(default=None, repr=False)
    #: the pause last read or made here, and when it was read
    _pause: Pause | None = field(default=None, repr=False)
    _read_at: datetime | None = field(default=None, repr=False)
    #: the budget's row: the mailer's identity (one row per provider account)
    _row: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._row = self.mailer.identity

    def start_run(self, concurrency: int) -> int:
        """The sends a run keeps in flight at this pace; a paced run's mailer is made ready."""
        if self.rate is not None:
            self.mailer.prepare()
        return paced_concurrency(concurrency, self.rate, self.lease)

    def stop(self) -> SendingPaused | None:
        """The stop of a run that a pause longer than a send may wait for holds, or None."""
        pause = self.long_pause(self.clock.now())
        return None if pause is None else SendingPaused(stop_line(pause))

    def send(self, transmit: Callable[[], SendOutcome]) -> SendOutcome:
        """Waits for the send's slot, sends, and heeds the answer.

        A pause or a backlog longer than the wait bound keeps the send from leaving, and so does
        a budget that cannot be read: the outcome says so, and nothing reached the provider.
        """
        now = self.clock.now()
        deadline = now + wait_bound(self.lease)
        try:
            held = self._wait_for_slot(deadline) if self.rate else self._wait_for_pause(deadline)
        except Exception as e:
            step_log.warning("pacing_unavailable", error=type(e).__name__)
            return SendOutcome.failed(FailureClass.TRANSIENT, "paced:budget_unavailable")
        if held is not None:
            return held_back(held, self.clock.now())
        return self.heed(transmit())

    def _wait_for_slot(self, deadline: datetime) -> Pause | None:
        """Takes a slot, waiting for it; the pause (or backlog) that outlasts `deadline` if not.

        One thread of the process at a time waits for the next slot, and takes it when it is
        due, right before its send: a thread the scheduler wakes late takes a later slot instead
        of crowding the next sender's request.
        """
        assert self.rate is not None
        interval = slot_interval(self.rate)
        backlog = Pause(deadline, "paced:backlog")
        if not self._gate.acquire(timeout=self._seconds_until(deadline)):
            return backlog
        try:
            while True:
                now = self.clock.now()
                if self._free_at is None or self._free_at <= now:
                    slot = self.budget.take_slot(self._row, interval, now)
                    self._remember(slot.pause, now)
                    self._free_at = slot.free_at
                    if slot.taken:
                        return None
                    if slot.pause is not None and slot.pause.until > deadline:
                        return slot.pause
                if self._free_at > deadline:
                    return backlog
                self.sleep(max((self._free_at - now).total_seconds(), 0.0))
        finally:
            self._gate.release()

    def _wait_for_pause(self, deadline: datetime) -> Pause | None:
        """Unpaced: waits out a short pause; the pause that outlasts `deadline` if one does."""
        now = self.clock.now()
        pause = self.pause_in_force(now)
        if pause is None:
            return None
        if pause.until > deadline:
            return pause
        self.sleep((pause.until - now).total_seconds())
        return None

    def _seconds_until(self, at: datetime) -> float:
        return max((at - self.clock.now()).total_seconds(), 0.0)

    def heed(self, outcome: SendOutcome) -> SendOutcome:
        """Records the pause the outcome asks of every sender; a quota gets its pause as its wait."""
        now = self.clock.now()
        pause = pause_after(outcome, now)
        if pause is None:
            return outcome
        self._remember(pause, now)
        try:
            self.budget.pause(self._row, pause)
        except Exception as e:
            # the answer is what matters: this worker pauses, the others learn of it from
            # their own throttled answers
            step_log.warning("pause_unrecorded", error=type(e).__name__)
        step_log.info("sending_paused", until=pause.until.isoformat(), why=pause.why)
        if outcome.quota and outcome.retry_after is None:
            return replace(outcome, retry_after=QUOTA_PAUSE)
        return outcome

    def pause_in_force(self, now: datetime) -> Pause | None:
        """The install's pause at `now`, read from the budget at most every `PAUSE_READ_EVERY`."""
        with self._lock:
            fresh = self._read_at is not None and now < self._read_at + PAUSE_READ_EVERY
            known = self._pause
        if not fresh:
            known = self.budget.current_pause(self._row)
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
