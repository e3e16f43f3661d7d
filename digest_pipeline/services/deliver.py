"""Deliver this week's due items: each claim checked, its attempt recorded, sent, its outcome recorded.

The outcome's failure class decides the next state through `domain.retry.decide`, and the result
is written with a compare-and-set on the fencing token. Claims go in waves (services/wave.py):
one ledger call records a wave's attempts as started before any of its sends, one records their
outcomes. The executor the worker is handed (`digest_pipeline.runtime`) decides how many waves
are in flight and on which threads; a worker returns only after every claim it took has a
recorded terminal state, retry schedule or `unknown`.

Two gates stop a run before it does harm. A period whose frozen snapshot changed after the freeze
is refused before its items are claimed (`SnapshotTampered`; a claim of one found later is given
back unsent). A run whose attempts keep failing with the same code (a revoked key) stops claiming
at the breaker's threshold (`BreakerOpen`, domain/breaker.py) and leaves the rest due.
"""

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from digest_pipeline.domain.breaker import as_retryable
from digest_pipeline.domain.delivery import (
    GiveBack,
    Instead,
    Outcome,
    PeriodFacts,
    Send,
    after_send,
    before_attempt,
    before_send,
    release,
    requeue_unstarted,
)
from digest_pipeline.domain.errors import (
    DigestError,
    LostRace,
    RenderError,
    SendingPaused,
    SnapshotTampered,
)
from digest_pipeline.domain.failures import FailureClass, SendOutcome, render_failure_code
from digest_pipeline.domain.model import (
    AttemptTicket,
    Claim,
    DigestRow,
    Message,
    Transition,
)
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.retry import (
    RandomSource,
)
from digest_pipeline.domain.states import DeliveryState, Settled
from digest_pipeline.ports.outside import Clock, Composer, Mailer
from digest_pipeline.services import period_gate
from digest_pipeline.services.evidence import RECONCILE_ACTOR as ACTOR
from digest_pipeline.services.executor import DeliveryExecutor, DueRun, Pace, WorkerLedger
from digest_pipeline.services.logs import item_log, step_log
from digest_pipeline.services.wave import (
    LOST_RACE,
    RELEASED,
    Content,
    DeliveryReport,
    SendPool,
    Started,
    Wave,
    outcome_of,
)


@dataclass(frozen=True)
class Deliverer:
    """Everything one delivery worker needs; `deliver_due` runs it over the due items."""

    ledger: WorkerLedger
    mailer: Mailer
    composer: Composer
    clock: Clock
    policy: DeliveryPolicy
    rand: RandomSource
    owner: str
    #: how the waves run: threads, overlap and process tuning (`digest_pipeline.runtime`)
    executor: DeliveryExecutor
    #: each period's window close and snapshot verdict, read at most once a lease
    _facts: dict[Period, PeriodFacts] = field(default_factory=dict, compare=False, repr=False)
    #: the install's pace and pause, shared through the ledger (None: a ledger that keeps none)
    pacer: Pace | None = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        pace = self.executor.pace(self.ledger, self.mailer, self.policy, self.clock)
        object.__setattr__(self, "pacer", pace)

    def paused(self) -> SendingPaused | None:
        """The stop of a run that a pause longer than a send may wait for holds, or None."""
        return None if self.pacer is None else self.pacer.stop()

    def facts(self, period: Period, now: datetime) -> PeriodFacts:
        """The period's window close (late grant included) and snapshot verdict.

        A worker reads them at most once a lease per period (a Dagster step, a sweep: once; a
        long-lived worker: every lease), since the snapshot check costs a pass over the
        snapshot. A claim outlives no lease, so every claim this worker sends was checked
        within one.
        """
        cached = self._facts.get(period)
        if cached is None or not cached.current(now, self.policy.lease):
            cached = self._facts[period] = period_gate.facts(self.ledger, self.policy, period, now)
        return cached

    def require_snapshot(self, period: Period) -> None:
        """Raises SnapshotTampered for a period whose snapshot changed (read once a lease)."""
        if (why := self.facts(period, self.clock.now()).refusal) is not None:
            raise SnapshotTampered(why, str(period))

    def deliver_one(self, claim: Claim) -> Settled:
        """Takes one claim to a recorded state; returns that state (or `lost_race`).

        Raises SnapshotTampered, after giving the claim back unsent, for a refused period.
        """
        now = self.clock.now()
        wave = self.prepare([claim], now)
        self.exchange([], [wave], None, now)
        self.exchange([self.collect(wave)], [], None, self.clock.now())
        if wave.refused:
            [(period, why)] = wave.refused.items()
            raise SnapshotTampered(why, str(period))
        return wave.settled[0]

    def give_back(self, claim: Claim, why: str) -> Settled:
        """Returns a claim that was never attempted to the queue, due now; `released`."""
        now = self.clock.now()
        try:
            self.ledger.apply(release(claim, now, why))
        except LostRace as e:
            item_log.warning("lost_race", key=claim.key, step="give_back", why=e)
            return LOST_RACE
        item_log.info("released", key=claim.key, reason=why)
        return RELEASED

    def content(self, claims: Sequence[Claim]) -> Content:
        """The frozen addresses and generated rows of the claims, read in two statements."""
        keys = [c.key for c in claims]
        return Content(self.ledger.recipients(keys), self.ledger.digest_rows_of(keys))

    def prepare(
        self, claims: Sequence[Claim], now: datetime, content: Content | None = None
    ) -> Wave:
        """Records what needs no send and composes the other claims' messages; sends nothing.

        `content` may hold the claims' addresses and rows already (read once for a whole
        claim); otherwise they are read here.
        """
        wave = Wave(list(claims), {})
        to_start: list[tuple[int, Claim, datetime | None]] = []
        for i, claim in enumerate(claims):
            facts = self.facts(claim.item.period, now)
            history = self.ledger.attempts(claim.key) if claim.item.attempts else ()
            identity = self.mailer.identity
            match before_attempt(claim, facts, history, identity, now, self.policy, ACTOR):
                case Send(closes_at):
                    to_start.append((i, claim, closes_at))
                case Instead(transition):
                    wave.settled[i] = self._record(claim, transition)
                case GiveBack(why):
                    if facts.refusal is not None:
                        wave.refused[claim.item.period] = facts.refusal
                    wave.settled[i] = self.give_back(claim, why)
        if to_start and content is None:
            content = self.content([c for _, c, _ in to_start])
        for i, claim, closes_at in to_start:
            assert content is not None
            message = self._compose(
                claim, content.recipients.get(claim.key), content.rows.get(claim.key, [])
            )
            wave.pending.append((i, claim, closes_at, message))
        return wave

    def still_sendable(self, wave: Wave, now: datetime) -> bool:
        """Whether every claim the wave would start may still be sent `now` (`before_send`).

        A wave composed ahead waits up to one send's latency before it starts.
        """
        return all(
            before_send(claim, closes_at, now, self.policy) is None
            for _, claim, closes_at, _ in wave.pending
        )

    def collect(self, wave: Wave) -> Wave:
        """Waits for the wave's sends; their outcomes, as they will be recorded, go on `wave`."""
        # A credential refusal is the sender's configuration, not the customer's fault: it is
        # recorded as transient (retried), never `failed` (domain/breaker.py).
        wave.outcomes = [as_retryable(outcome_of(f)) for f in wave.sends]
        return wave

    def exchange(
        self,
        record: Sequence[Wave],
        start: Sequence[Wave],
        pool: SendPool | None,
        now: datetime,
        *,
        send: bool = True,
    ) -> None:
        """Records the collected waves and starts the prepared ones in one ledger call.

        Then it sends the started ones (`dispatch`), unless `send` is False: the caller then
        dispatches them itself, after this returns. Every attempt is recorded as started
        before its send; a recorded wave's states are then on its `settled`.
        """
        steps = [
            (s.ticket, self._after(s, o))
            for w in record
            for (_, s), o in zip(w.started, w.outcomes, strict=True)
        ]
        results = [(closed, after.outcome, after.transition) for closed, after in steps]
        pending = [p for w in start for p in w.pending]
        if not results and not pending:
            return
        errors, tickets = self.ledger.record_and_start(
            results, [c for _, c, _, _ in pending], now, mailer=self.mailer.identity
        )
        done = iter(zip(steps, errors, strict=True))
        for w in record:
            for i, s in w.started:
                (closed, after), error = next(done)
                w.settled[i] = self._logged(s.claim, after.transition, error, closed, after)
        issued = iter(zip(pending, tickets, strict=True))
        for w in start:
            for _ in range(len(w.pending)):
                (i, claim, closes_at, message), ticket = next(issued)
                if isinstance(ticket, DigestError):
                    w.settled[i] = self._release(claim, ticket)
                    continue
                w.started.append((i, Started(claim, ticket, closes_at)))
                w.unsent.append(message)
            w.pending = []
        if send:
            self.dispatch(start, pool)

    def dispatch(self, started: Sequence[Wave], pool: SendPool | None) -> None:
        """Sends the waves' started claims, in order: on `pool`, or here when it is None."""
        for w in started:
            for message in w.unsent:
                if isinstance(message, SendOutcome):
                    w.sends.append(message)
                elif pool is None:
                    w.sends.append(self._transmit(message))
                else:
                    w.sends.append(pool.submit(self._transmit, message))
            w.unsent = []

    def _release(self, claim: Claim, lost: DigestError) -> Settled:
        """A claim whose lease ran out before its attempt started goes back to the queue.

        One whose customer was suppressed meanwhile ended `suppressed` instead (the ledger
        checks the suppression list in the transaction that would have started the attempt).
        """
        now = self.clock.now()
        current = self.ledger.get(claim.key)
        if current is not None and current.state is DeliveryState.SUPPRESSED:
            item_log.info("suppressed_before_attempt", key=claim.key)
            return DeliveryState.SUPPRESSED
        requeue = requeue_unstarted(claim, current, self.ledger.attempts(claim.key), now)
        if requeue is not None:
            try:
                self.ledger.apply(requeue)
            except LostRace:
                pass
            else:
                item_log.info("released", key=claim.key, reason=requeue.detail)
                return DeliveryState.RETRY_SCHEDULED
        if not isinstance(lost, LostRace):
            raise lost
        item_log.warning("lost_race", key=claim.key, step="start", why=lost)
        return LOST_RACE

    def _compose(
        self, claim: Claim, recipient: str | None, rows: list[DigestRow]
    ) -> Message | SendOutcome:
        """The message, or the permanent failure that stops it before anything leaves.

        Composing runs on the worker's own thread: the pool threads then mostly wait on the
        network, and the ledger calls between waves do not queue behind them for the GIL.
        """
        if recipient is None:
            return SendOutcome.failed(FailureClass.PERMANENT, "no_recipient_in_snapshot")
        try:
            return self.composer.compose(claim.item, recipient, rows)
        except RenderError as e:
            # The refusal names the field and the product (never an address or content); the
            # item's detail stays a stable code (`render_error`, or `invalid_recipient` for the
            # customer's address), the log line says which row.
            why = str(e).removeprefix(f"{claim.key}: ")
            item_log.info("render_refused", key=claim.key, why=why)
            return SendOutcome.failed(FailureClass.PERMANENT, render_failure_code(e))
        except Exception as e:
            # Rendering happens before anything leaves, so a composer bug is permanent for this
            # item (replayable once fixed) and must not stop the rest of the batch.
            item_log.error("render_raised", key=claim.key, error=type(e).__name__)
            return SendOutcome.failed(FailureClass.PERMANENT, f"render_raised:{type(e).__name__}")

    def _transmit(self, message: Message) -> SendOutcome:
        if self.pacer is None:
            return self._send(message)
        return self.pacer.send(lambda: self._send(message))

    def _send(self, message: Message) -> SendOutcome:
        try:
            return self.mailer.send(message, idempotency_key=str(message.key))
        except Exception as e:
            # Mailers classify their own failures; one that raises anyway may have sent, so
            # the only safe reading is `unknown`, never "not sent".
            item_log.error("mailer_raised", key=message.key, error=type(e).__name__)
            return SendOutcome.failed(FailureClass.UNKNOWN, f"mailer_raised:{type(e).__name__}")

    def _after(self, started: Started, outcome: SendOutcome) -> Outcome:
        return after_send(
            started.claim,
            outcome,
            started_at=started.ticket.started_at,
            closes_at=started.closes_at,
            now=self.clock.now(),
            policy=self.policy,
            rand=self.rand,
        )

    def _record(self, claim: Claim, transition: Transition) -> Settled:
        """Applies a transition that closes no attempt."""
        try:
            self.ledger.apply(transition)
        except LostRace as e:
            return self._logged(claim, transition, e)
        return self._logged(claim, transition, None)

    def _logged(
        self,
        claim: Claim,
        transition: Transition,
        error: DigestError | None,
        ticket: AttemptTicket | None = None,
        after: Outcome | None = None,
    ) -> Settled:
        if error is not None:
            if not isinstance(error, LostRace):
                raise error
            item_log.warning("lost_race", key=claim.key, step="record", why=error)
            return LOST_RACE
        if after is not None and after.suppression is not None:
            # next week's snapshot leaves the customer out, and their other weeks' items whose
            # attempt has not started end `suppressed` with it
            self.ledger.suppress(after.suppression)
        # A plain `sent` is the common case: per item only at DEBUG, so a week of 100,000
        # sends does not become 100,000 rows in Dagster's event log; everything else is INFO.
        routine = after.routine if after is not None else transition.target is DeliveryState.SENT
        outcome = after.outcome if after is not None else None
        item_log.log(
            logging.DEBUG if routine else logging.INFO,
            "attempt_recorded",
            key=claim.key,
            state=transition.target.value,
            outcome=outcome.label if outcome else None,
            detail=transition.detail,
            attempt=ticket.number if ticket else None,
            duplicate=True if outcome is not None and outcome.duplicate else None,
        )
        return transition.target


def deliver_due(
    deliverer: Deliverer,
    *,
    batch_size: int,
    concurrency: int,
    period: Period | None = None,
    max_items: int | None = None,
    should_continue: Callable[[], bool] = lambda: True,
    breaker_threshold: int | None = None,
    report: DeliveryReport | None = None,
) -> DeliveryReport:
    """Claims due items `batch_size` at a time and delivers each batch with bounded concurrency.

    Stops when nothing is due, after `max_items` claims, or when `should_continue` says so.
    Returns this run's report; `report`, when given, gets its counts added, also when the run
    stops with one of the errors below.

    Raises:
        SnapshotTampered: the period's frozen snapshot (with no `period`: an open period's)
            changed after the freeze. Checked before anything is claimed, so its items stay as
            they were; a claim of it found later is given back unsent.
        BreakerOpen: `breaker_threshold` consecutive attempts (None or 0: never) failed with the
            same class and detail. The run stopped claiming; every attempt it started is
            recorded, and the claims it had not attempted are given back due.
        SendingPaused: the provider's rate limit or quota paused the install's senders for
            longer than a send may wait (domain/pacing.py); as with the breaker, the rest stays
            due. Raised before anything is claimed when the pause was already in force.
    """
    if batch_size < 1 or concurrency < 1:
        raise ValueError("batch_size and concurrency must be at least 1")
    for checked in [period] if period is not None else deliverer.ledger.open_periods():
        deliverer.require_snapshot(checked)
    if deliverer.pacer is not None:
        concurrency = deliverer.pacer.start_run(concurrency)
    done = DeliveryReport()
    # a customer suppressed after the snapshot froze (or between runs) is never claimed: their
    # unclaimed items end `suppressed` before this run takes any
    done.suppressed = len(deliverer.ledger.cancel_suppressed(deliverer.clock.now(), period))
    run = DueRun(
        deliverer, period, batch_size, concurrency, max_items, should_continue, breaker_threshold
    )
    stop = deliverer.executor.deliver(run, done)
    if done.claimed or done.suppressed:
        # one field per outcome label; typed Any because the logger's own keywords (exc_info,
        # extra) share the namespace, and no label is one of them
        counts: dict[str, Any] = dict(sorted(done.outcomes.items()))
        step_log.info(
            "delivered",
            owner=deliverer.owner,
            claimed=done.claimed,
            lost_races=done.lost_races,
            released=done.released or None,
            suppressed=done.suppressed or None,
            **counts,
        )
    if report is not None:
        report.add(done)
    if stop is not None:
        # the caller reports the line (a failed step, `digest sweep`'s `stopped:`); a log line here
        # at a louder level would only print it twice
        step_log.info("delivery_stopped", owner=deliverer.owner, why=stop)
        raise stop
    return done
