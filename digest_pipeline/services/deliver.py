"""The delivery gate: claim due items, record each attempt before the send, record its outcome.

The outcome's failure class decides the next state through `domain.retry.decide`, and the result
is written with a compare-and-set on the fencing token. Work goes in waves of at most
`concurrency` items: one transaction records the wave's attempts as started, the sends run in
parallel (a remote mailer's on a pool; a local one's in turn on this thread), one transaction
records their outcomes; so at most `concurrency` sends are ever open per worker, and the ledger
sees a few statements per wave instead of several per item. A worker
returns only after every claim it took has a recorded terminal state, retry schedule or
`unknown`.

Two gates stop a run before it does harm. A period whose frozen snapshot changed after the freeze
is refused before its items are claimed (`SnapshotTampered`; a claim of one found later is given
back unsent). A run whose attempts keep failing with the same code (a revoked key) stops claiming
at the breaker's threshold (`BreakerOpen`, domain/breaker.py) and leaves the rest due.
"""

import logging
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime

from digest_pipeline.domain.bounces import hard_bounce
from digest_pipeline.domain.breaker import Breaker, as_retryable
from digest_pipeline.domain.errors import (
    BreakerOpen,
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
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.reconciliation import already_confirmed
from digest_pipeline.domain.retry import (
    RandomSource,
)
from digest_pipeline.domain.states import DeliveryState, NotRecorded, Settled
from digest_pipeline.domain.transitions import (
    after_attempt,
    before_send,
    release,
    requeue_unstarted,
    resend_through_other_mailer,
)
from digest_pipeline.domain.waves import AHEAD_WAVES, wave_shape
from digest_pipeline.ports import Clock, Composer, Ledger, Mailer
from digest_pipeline.services import late
from digest_pipeline.services.evidence import RECONCILE_ACTOR
from digest_pipeline.services.logs import log_event
from digest_pipeline.services.pacing import Pacer, pacer_for
from digest_pipeline.services.snapshot_gate import snapshot_refusal
from digest_pipeline.services.tuning import fewer_collections, prompt_handover

LOST_RACE = NotRecorded.LOST_RACE
RELEASED = NotRecorded.RELEASED


@dataclass
class DeliveryReport:
    """What one worker did: claims taken and the state each ended in."""

    claimed: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    #: claims whose compare-and-set lost to another worker or the lease sweeper
    lost_races: int = 0
    #: claims given back due without an attempt: of a refused period, or after the breaker opened
    released: int = 0
    #: never-claimed items of suppressed customers, cancelled before the run claimed anything
    suppressed: int = 0

    def count(self, states: Sequence[Settled]) -> None:
        for state in states:
            if state == LOST_RACE:
                self.lost_races += 1
            elif state == RELEASED:
                self.released += 1
            else:
                self.outcomes[state] += 1

    def add(self, other: "DeliveryReport") -> None:
        """Adds another run's counts to these."""
        self.claimed += other.claimed
        self.outcomes.update(other.outcomes)
        self.lost_races += other.lost_races
        self.released += other.released
        self.suppressed += other.suppressed


@dataclass(frozen=True)
class Content:
    """What messages are made of, read for many claims at once: addresses and rows by key."""

    recipients: dict[OperationKey, str]
    rows: dict[OperationKey, list[DigestRow]]


@dataclass(frozen=True)
class _Started:
    """A claim whose attempt is recorded as started, with its delivery window's close."""

    claim: Claim
    ticket: AttemptTicket
    closes_at: datetime | None


@dataclass
class Wave:
    """Claims on their way through one wave: settled before sending, or started and sending."""

    claims: list[Claim]
    settled: dict[int, Settled]
    #: claims to start, with their window close and their message (or the failure instead)
    pending: list[tuple[int, Claim, datetime | None, Message | SendOutcome]] = field(
        default_factory=list
    )
    started: list[tuple[int, _Started]] = field(default_factory=list)
    #: the started claims' messages (or failures instead) not yet handed to `dispatch`
    unsent: list[Message | SendOutcome] = field(default_factory=list)
    #: each started claim's send: a pool's future, or the outcome of one that ran inline
    sends: list[Future[SendOutcome] | SendOutcome] = field(default_factory=list)
    #: the started claims' outcomes, in order, once the sends are done (`Deliverer.collect`)
    outcomes: list[SendOutcome] = field(default_factory=list)
    #: periods whose claims were given back unsent because the snapshot changed, with the line
    refused: dict[Period, str] = field(default_factory=dict)

    def states(self) -> list[Settled]:
        """Each claim's state, in the order the claims came (once the wave is recorded)."""
        return [self.settled[i] for i in range(len(self.claims))]


def _outcome(send: Future[SendOutcome] | SendOutcome) -> SendOutcome:
    return send if isinstance(send, SendOutcome) else send.result()


def _finished(send: Future[SendOutcome] | SendOutcome) -> bool:
    return isinstance(send, SendOutcome) or send.done()


@dataclass(frozen=True)
class Deliverer:
    """Everything one delivery worker needs; `deliver_due` runs it over the due items."""

    ledger: Ledger
    mailer: Mailer
    composer: Composer
    clock: Clock
    policy: DeliveryPolicy
    rand: RandomSource
    owner: str
    #: each period's window close (late grants included), read once per worker
    _closes: dict[Period, datetime] = field(default_factory=dict, compare=False, repr=False)
    #: each period's snapshot verdict (None: unchanged) and when it was read
    _snapshots: dict[Period, tuple[datetime, str | None]] = field(
        default_factory=dict, compare=False, repr=False
    )
    #: the install's pace and pause, shared through the ledger (None: a ledger that keeps none)
    pacer: Pacer | None = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "pacer", pacer_for(self.ledger, self.mailer, self.policy, self.clock)
        )

    def paused(self) -> SendingPaused | None:
        """The stop of a run that a pause longer than a send may wait for holds, or None."""
        return None if self.pacer is None else self.pacer.stop()

    def closes_at(self, period: Period) -> datetime:
        """The period's delivery window close, an operator's late grant included."""
        if period not in self._closes:
            self._closes[period] = late.closes_at(self.ledger, self.policy, period)
        return self._closes[period]

    def snapshot_refusal(self, period: Period) -> str | None:
        """The refusal line of a period whose frozen snapshot changed, or None while it holds.

        The ledger's check fingerprints the whole snapshot (on PostgreSQL, after a ledger's
        first, it counts the rows' writer instead: `invariants.Seal`), so a worker asks at most
        once a lease per period (a Dagster step, a sweep: once; a long-lived worker: every
        lease). A claim outlives neither, so every claim this worker sends was checked within a
        lease.
        """
        now = self.clock.now()
        cached = self._snapshots.get(period)
        if cached is not None and cached[0] <= now < cached[0] + self.policy.lease:
            return cached[1]
        why = snapshot_refusal(self.ledger, period, now)
        self._snapshots[period] = (now, why)
        return why

    def require_snapshot(self, period: Period) -> None:
        """Raises SnapshotTampered for a period whose snapshot changed (cached, see above)."""
        if (why := self.snapshot_refusal(period)) is not None:
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
        [state] = wave.states()
        return state

    def give_back(self, claim: Claim, why: str) -> Settled:
        """Returns a claim that was never attempted to the queue, due now; `released`."""
        now = self.clock.now()
        try:
            self.ledger.apply(release(claim, now, why))
        except LostRace as e:
            log_event("lost_race", logging.WARNING, key=claim.key, step="give_back", why=e)
            return LOST_RACE
        log_event("released", key=claim.key, reason=why)
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
        # Fencing: a claim is checked against its period's snapshot before its attempt starts,
        # whoever claimed it and however long ago; a refused one goes back without an attempt.
        for period in {c.item.period for c in claims}:
            if (why := self.snapshot_refusal(period)) is not None:
                wave.refused[period] = why
        to_start: list[tuple[int, Claim, datetime | None]] = []
        for i, claim in enumerate(claims):
            if claim.item.period in wave.refused:
                wave.settled[i] = self.give_back(claim, "snapshot_tampered")
                continue
            settled = self._settle_without_sending(claim, now)
            if isinstance(settled, str):
                wave.settled[i] = settled
            else:
                to_start.append((i, claim, settled))
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
        wave.outcomes = [as_retryable(_outcome(f)) for f in wave.sends]
        return wave

    def exchange(
        self,
        record: Sequence[Wave],
        start: Sequence[Wave],
        pool: ThreadPoolExecutor | None,
        now: datetime,
        *,
        send: bool = True,
    ) -> None:
        """Records the collected waves and starts the prepared ones in one ledger call.

        Then it sends the started ones (`dispatch`), unless `send` is False: the caller then
        dispatches them itself, after this returns. Every attempt is recorded as started
        before its send; a recorded wave's states are then on its `settled`.
        """
        results = [
            (s.ticket, o, self._next(s.claim, o, s.ticket.started_at, s.closes_at))
            for w in record
            for (_, s), o in zip(w.started, w.outcomes, strict=True)
        ]
        pending = [p for w in start for p in w.pending]
        if not results and not pending:
            return
        errors, tickets = self.ledger.record_and_start(
            results, [c for _, c, _, _ in pending], now, mailer=self.mailer.identity
        )
        done = iter(zip(results, errors, strict=True))
        for w in record:
            for i, s in w.started:
                (closed, outcome, transition), error = next(done)
                w.settled[i] = self._logged(s.claim, closed, outcome, transition, error)
        issued = iter(zip(pending, tickets, strict=True))
        for w in start:
            for _ in range(len(w.pending)):
                (i, claim, closes_at, message), ticket = next(issued)
                if isinstance(ticket, DigestError):
                    w.settled[i] = self._release(claim, ticket)
                    continue
                w.started.append((i, _Started(claim, ticket, closes_at)))
                w.unsent.append(message)
            w.pending = []
        if send:
            self.dispatch(start, pool)

    def dispatch(self, started: Sequence[Wave], pool: ThreadPoolExecutor | None) -> None:
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

    def _settle_without_sending(self, claim: Claim, now: datetime) -> Settled | datetime | None:
        """The recorded state of a claim that must not be sent, or else its window's close.

        A replay has no delivery window: None.
        """
        item = claim.item
        closes_at = None if item.replayed_at is not None else self.closes_at(item.period)
        if (instead := before_send(claim, closes_at, now, self.policy)) is not None:
            return self._record(claim, instead)
        if item.attempts:
            history = self.ledger.attempts(claim.key)
            if (confirmed := already_confirmed(claim, history, now, RECONCILE_ACTOR)) is not None:
                return self._record(claim, confirmed)
            elsewhere = resend_through_other_mailer(claim, history, self.mailer.identity, now)
            if elsewhere is not None:
                return self._record(claim, elsewhere)
        return closes_at

    def _release(self, claim: Claim, lost: DigestError) -> Settled:
        """A claim whose lease ran out before its attempt started goes back to the queue.

        One whose customer was suppressed meanwhile ended `suppressed` instead (the ledger
        checks the suppression list in the transaction that would have started the attempt).
        """
        now = self.clock.now()
        current = self.ledger.get(claim.key)
        if current is not None and current.state is DeliveryState.SUPPRESSED:
            log_event("suppressed_before_attempt", key=claim.key)
            return DeliveryState.SUPPRESSED
        requeue = requeue_unstarted(claim, current, self.ledger.attempts(claim.key), now)
        if requeue is not None:
            try:
                self.ledger.apply(requeue)
            except LostRace:
                pass
            else:
                log_event("released", key=claim.key, reason=requeue.detail)
                return DeliveryState.RETRY_SCHEDULED
        if not isinstance(lost, LostRace):
            raise lost
        log_event("lost_race", logging.WARNING, key=claim.key, step="start", why=lost)
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
            log_event("render_refused", logging.INFO, key=claim.key, why=why)
            return SendOutcome.failed(FailureClass.PERMANENT, render_failure_code(e))
        except Exception as e:
            # Rendering happens before anything leaves, so a composer bug is permanent for this
            # item (replayable once fixed) and must not stop the rest of the batch.
            log_event("render_raised", logging.ERROR, key=claim.key, error=type(e).__name__)
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
            log_event("mailer_raised", logging.ERROR, key=message.key, error=type(e).__name__)
            return SendOutcome.failed(FailureClass.UNKNOWN, f"mailer_raised:{type(e).__name__}")

    def _next(
        self,
        claim: Claim,
        outcome: SendOutcome,
        started_at: datetime,
        closes_at: datetime | None,
    ) -> Transition:
        return after_attempt(
            claim,
            outcome,
            started_at=started_at,
            closes_at=closes_at,
            now=self.clock.now(),
            policy=self.policy,
            rand=self.rand,
        )

    def _record(self, claim: Claim, transition: Transition) -> Settled:
        """Applies a transition that closes no attempt."""
        try:
            self.ledger.apply(transition)
        except LostRace as e:
            return self._logged(claim, None, None, transition, e)
        return self._logged(claim, None, None, transition, None)

    def _logged(
        self,
        claim: Claim,
        ticket: AttemptTicket | None,
        outcome: SendOutcome | None,
        transition: Transition,
        error: DigestError | None,
    ) -> Settled:
        if error is not None:
            if not isinstance(error, LostRace):
                raise error
            log_event("lost_race", logging.WARNING, key=claim.key, step="record", why=error)
            return LOST_RACE
        if outcome is not None and (
            bounce := hard_bounce(claim.key.customer_id, outcome, transition.at)
        ):
            # next week's snapshot leaves the customer out, and their other weeks' items whose
            # attempt has not started end `suppressed` with it
            self.ledger.suppress(bounce)
        # A plain `sent` is the common case: per item only at DEBUG, so a week of 100,000
        # sends does not become 100,000 rows in Dagster's event log; everything else is INFO.
        routine = transition.target is DeliveryState.SENT and (
            outcome is None or not outcome.duplicate
        )
        log_event(
            "attempt_recorded",
            logging.DEBUG if routine else logging.INFO,
            key=claim.key,
            state=transition.target.value,
            outcome=outcome.label if outcome else None,
            detail=transition.detail,
            attempt=ticket.number if ticket else None,
            duplicate=True if outcome is not None and outcome.duplicate else None,
        )
        return transition.target


@dataclass
class _Run:
    """One `deliver_due` run: the waves in flight, the claims not yet launched, the breaker."""

    deliverer: Deliverer
    period: Period | None
    breaker: Breaker
    size: int
    depth: int
    #: items one claim takes (`deliver_due`'s `batch_size`)
    claim: int
    #: claims this run may take in all (None: no cap)
    max_items: int | None
    #: asked before each claim; False ends the run's claiming
    should_continue: Callable[[], bool]
    done: DeliveryReport = field(default_factory=DeliveryReport)
    in_flight: deque[Wave] = field(default_factory=deque)
    queued: deque[Claim] = field(default_factory=deque)
    content: Content = field(default_factory=lambda: Content({}, {}))
    #: why the run stops early: a refused period or the open breaker
    stop: DigestError | None = None
    #: the next wave, composed while the ledger recorded the last exchange or while every slot
    #: was sending; it starts when a slot is free
    ready: Wave | None = None
    #: a local mailer's run over a database server: the thread each exchange's ledger call runs
    #: on while this one composes the next wave (a remote mailer's run composes while its sends
    #: are out instead)
    ledger_thread: ThreadPoolExecutor | None = None
    #: any run over a database server: the thread the next claim is taken on (`claim_ahead`),
    #: with its own connection
    claim_thread: ThreadPoolExecutor | None = None
    #: the next claim and its content, taken while the queue's last waves are composed and
    #: started; taken up when the queue is empty
    claiming: Future[tuple[list[Claim], Content]] | None = None

    #: no more claims this run: nothing came, `max_items` was reached or `should_continue` said so
    drained: bool = False

    def open_attempts(self, fresh: Sequence[Wave] = ()) -> int:
        """Attempts started (or about to start, in `fresh`) whose outcomes are not recorded."""
        return sum(len(w.started) for w in self.in_flight) + sum(len(w.pending) for w in fresh)

    def collect(self, block: bool) -> list[Wave]:
        """Takes the finished waves off the front of the flight and feeds the breaker.

        The oldest (waited for when `block`), then every one after it whose sends are all
        done; their outcomes are recorded by the next exchange.
        """
        taken: list[Wave] = []
        while self.in_flight and (
            (block and not taken) or all(_finished(f) for f in self.in_flight[0].sends)
        ):
            wave = self.deliverer.collect(self.in_flight.popleft())
            taken.append(wave)
            for outcome in wave.outcomes:
                self.breaker.record(outcome)
            if self.stop is not None:
                continue
            if wave.refused:
                refused, why = next(iter(wave.refused.items()))
                self.stop = SnapshotTampered(why, str(refused))
            elif (paused := self.deliverer.paused()) is not None:
                self.stop = paused
            elif self.breaker.open:
                where = "" if self.period is None else f"period {self.period}: "
                self.stop = BreakerOpen(where + self.breaker.reason())
        return taken

    def room(self) -> int:
        """Items the next claim may take, before the breaker's bound; 0, and drained, if none."""
        room = (
            self.claim
            if self.max_items is None
            else min(self.claim, self.max_items - self.done.claimed)
        )
        if room > 0 and self.stop is None and (paused := self.deliverer.paused()) is not None:
            # nothing is claimed while a pause lasts longer than a send may wait
            self.stop = paused
        if room <= 0 or self.stop is not None or not self.should_continue():
            self.drained = True
            return 0
        return room

    def take(self, room: int, fresh: Sequence[Wave]) -> bool:
        """Claims up to `room` due items (fewer if the breaker says so); False if none came."""
        bound = self.breaker.room(self.open_attempts(fresh))
        if bound is not None:
            room = min(room, bound)
        if room <= 0:
            return False
        return self.taken(*self.claim_with_content(room))

    def claim_with_content(self, room: int) -> tuple[list[Claim], Content]:
        """Claims up to `room` due items and reads their content; runs on either thread."""
        d = self.deliverer
        if self.period is not None:
            d.require_snapshot(self.period)  # cached; re-read at most once a lease
        claims = d.ledger.claim_due(d.clock.now(), d.owner, d.policy.lease, room, self.period)
        return claims, d.content(claims) if claims else Content({}, {})

    def taken(self, claims: list[Claim], content: Content) -> bool:
        """Queues a claim's items; False, and drained, if it took none."""
        if not claims:
            self.drained = True
            return False
        self.done.claimed += len(claims)
        self.content = content
        self.queued.extend(claims)
        return True

    def take_claimed_ahead(self, claiming: Future[tuple[list[Claim], Content]]) -> bool:
        """Queues the claim taken ahead (waiting for it, or raising its error); False if none came.

        Only an empty queue takes it up, after the wave composed ahead was started or put back,
        so no queued claim needs the content it replaces.
        """
        self.claiming = None
        return self.taken(*claiming.result())

    def refill(self, fresh: Sequence[Wave]) -> bool:
        """Claims the next batch once the queue is empty; False if there is nothing to take."""
        if self.queued:
            return True
        if self.claiming is not None:
            return self.take_claimed_ahead(self.claiming)
        if self.drained:
            return False
        room = self.room()
        return room > 0 and self.take(room, fresh)

    def claim_ahead(self, opened: int, left: int) -> None:
        """Hands the next claim to the claim thread once at most `AHEAD_WAVES` waves are queued.

        `left`: the claims still queued once the wave being composed is out. The claim runs
        there, on its own connection, while this thread composes and the last waves send or
        record, instead of standing between waves; it is taken up when the queue is empty.
        Started with a wave or less left, it would still be being taken when the queue empties,
        and the step would wait for it. A crash can strand that claim's
        leases, the waves still queued and the wave composed ahead, never started; they come
        back due when the leases run out. Not while the breaker bounds the room: its streak
        decides how much to claim.
        """
        if (
            self.claim_thread is None
            or self.claiming is not None
            or self.drained
            or left > AHEAD_WAVES * self.size
            or self.breaker.room(opened) is not None
        ):
            return
        if (room := self.room()) > 0:
            self.claiming = self.claim_thread.submit(self.claim_with_content, room)

    def next_wave(self, open_attempts: int, now: datetime) -> Wave | None:
        """Prepares the next wave of queued claims, as large as the breaker allows; None if none.

        `open_attempts`: attempts started or about to start whose outcomes are not recorded.
        """
        bound = self.breaker.room(open_attempts)
        n = min(self.size, len(self.queued), self.size if bound is None else bound)
        if n <= 0:
            return None
        claims = [self.queued.popleft() for _ in range(n)]
        return self.deliverer.prepare(claims, now, self.content)

    def step(self, pool: ThreadPoolExecutor | None) -> bool:
        """Records the finished waves and starts the next in one ledger call; False when done.

        With every slot taken it composes the next wave from the queued claims, then waits for
        the oldest. When sends are fast, several waves finish together and their outcomes go
        into one exchange; when they are slow, one does. Each exchange starts one wave.
        """
        full = len(self.in_flight) == self.depth
        if full and self.stop is None and self.queued and self.ready is None:
            # Compose the next wave while the flight's sends run, so the slot that frees first
            # waits only for the ledger; once few waves are left, the next claim is taken ahead.
            # Its size is the breaker's room now; outcomes recorded before it starts can start a
            # streak that bounds the room, so it is checked again then.
            self.ready = self.next_wave(self.open_attempts(), self.deliverer.clock.now())
            self.claim_ahead(self.open_attempts(), len(self.queued))
        record = self.collect(block=full)
        now = self.deliverer.clock.now()
        fresh: list[Wave] = []
        if self.ready is not None:
            ready, self.ready = self.ready, None
            room = self.breaker.room(self.open_attempts())
            if (
                self.stop is None
                and self.deliverer.still_sendable(ready, now)
                and (room is None or len(ready.pending) <= room)
            ):
                fresh.append(ready)
            else:
                # stopped, a window or a dedupe guarantee ran out while it waited, or the
                # outcomes recorded since it was composed started a streak the breaker now
                # bounds: its claims queue again, to be given back or prepared afresh
                self.put_back(ready)
        if self.stop is None and not fresh and len(self.in_flight) < self.depth:
            # One wave an exchange, sent as soon as it is started: waves composed together
            # would start, end and be recorded together, every slot idle while the next ones
            # are composed.
            # None: the breaker holds it back until the outcomes in flight are in.
            wave = self.next_wave(self.open_attempts(), now) if self.refill(fresh) else None
            if wave is not None:
                fresh.append(wave)
                self.claim_ahead(self.open_attempts(fresh), len(self.queued))
        if not record and not fresh:
            if not self.in_flight:
                return False
            # nothing can start before an outcome is in: wait for the oldest wave
            record = self.collect(block=True)
        self.exchange(record, fresh, pool, now, ahead=True)
        return True

    def exchange(
        self,
        record: list[Wave],
        fresh: list[Wave],
        pool: ThreadPoolExecutor | None,
        now: datetime,
        *,
        ahead: bool = False,
    ) -> None:
        """One ledger call for the collected and the prepared waves; counts the recorded.

        With `ahead` and a ledger thread, the ledger call runs there while this thread composes
        the next wave from the queued claims (`ready`), then sends: the worker's Python and the
        database's work overlap instead of taking turns. Nothing else touches the waves meanwhile, and the
        breaker's room counts the waves being started as open, as `step`'s own composing does.
        """
        d = self.deliverer
        more = self.queued or self.claiming is not None
        if not ahead or self.ledger_thread is None or self.stop is not None or not more:
            d.exchange(record, fresh, pool, now)
        else:
            opened = self.open_attempts(fresh)
            recording = self.ledger_thread.submit(d.exchange, record, fresh, pool, now, send=False)
            # the wave composed next, below, is taken off the queue
            self.claim_ahead(opened, len(self.queued) - (self.size if self.ready is None else 0))
            try:
                if self.ready is None:
                    if not self.queued and self.claiming is not None:
                        # the next claim's first wave is composed while the last one records
                        self.take_claimed_ahead(self.claiming)
                    self.ready = self.next_wave(opened, d.clock.now())
            finally:
                # the ledger's answer (or its error) before anything else: a compose error
                # must not leave a wave half recorded behind this thread's back
                recording.result()
            # the sends run here, after their attempts are recorded: a local mailer's sends are
            # this process's CPU (the outbox serialises each message), which the ledger thread
            # would only take turns with
            d.dispatch(fresh, pool)
        for wave in record:
            self.done.count(wave.states())
        self.in_flight.extend(fresh)

    def drain(self) -> None:
        """Records every wave still in flight, waiting for their sends, in one exchange."""
        record: list[Wave] = []
        while self.in_flight:
            record += self.collect(block=True)
        if record:
            self.exchange(record, [], None, self.deliverer.clock.now())

    def put_back(self, wave: Wave) -> None:
        """A wave composed but never started: its claims queue again (to be given back)."""
        for _, claim, _, _ in reversed(wave.pending):
            self.queued.appendleft(claim)
        self.done.count([wave.settled[i] for i in sorted(wave.settled)])

    def give_back_queued(self) -> None:
        """Claims the run took and never attempted go back to due, as if never claimed.

        A claim taken ahead is queued first: a run that stopped still holds its leases.
        """
        if self.claiming is not None:
            self.take_claimed_ahead(self.claiming)
        why = (
            "stopped:paused"
            if isinstance(self.stop, SendingPaused)
            else "stopped:breaker_open"
            if isinstance(self.stop, BreakerOpen)
            else "stopped:refused"
        )
        while self.queued:
            self.done.count([self.deliverer.give_back(self.queued.popleft(), why)])


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
    size, depth = wave_shape(concurrency, deliverer.mailer.capabilities.remote)
    run = _Run(
        deliverer,
        period,
        Breaker(breaker_threshold),
        size,
        depth,
        batch_size,
        max_items,
        should_continue,
    )
    # a customer suppressed after the snapshot froze (or between runs) is never claimed: their
    # unclaimed items end `suppressed` before this run takes any
    run.done.suppressed = len(deliverer.ledger.cancel_suppressed(deliverer.clock.now(), period))
    # `depth` waves overlap: while some waves' sends are in flight, this thread records the
    # outcomes of the wave that finished and starts the next; together they never hold more
    # than `concurrency` open attempts; each exchange starts one wave. Over a database server,
    # the next claim is taken on a thread of its own while the queue's last waves are composed
    # (`_Run.claim_ahead`); on SQLite, once the queue is empty.
    # When the breaker holds a claim or a wave back, the oldest wave in flight is recorded
    # first: its outcomes say whether the provider takes our messages.
    # A local mailer's send ends before the ledger could record anything (a file link, a
    # memory write): it runs here, in turn, without a pool's future and lock for each message.
    # With a remote mailer this thread composes while the sends are out; with a local one
    # there is nothing out, so, over a database server, it composes while the ledger thread
    # records and starts (with a prompt GIL handover: the ledger thread needs it between
    # statements). The ledger thread helps a local run on PostgreSQL, and slows a
    # remote one (whose pool threads wait for the GIL too) and any run on SQLite.
    remote = deliverer.mailer.capabilities.remote
    overlap = not remote and deliverer.ledger.out_of_process
    # the claim taken ahead pays on both loops over a database server, a latency-bound run's
    # included: the next claim is ready before the queue empties
    ahead = deliverer.ledger.out_of_process
    with (
        fewer_collections(),
        ThreadPoolExecutor(max_workers=concurrency) if remote else nullcontext() as pool,
        prompt_handover() if overlap else nullcontext(),
        ThreadPoolExecutor(1, "ledger") if overlap else nullcontext() as run.ledger_thread,
        ThreadPoolExecutor(1, "claims") if ahead else nullcontext() as run.claim_thread,
    ):
        while run.stop is None and run.step(pool):
            pass
        run.drain()
    run.give_back_queued()
    done = run.done
    if done.claimed or done.suppressed:
        log_event(
            "delivered",
            owner=deliverer.owner,
            claimed=done.claimed,
            lost_races=done.lost_races,
            released=done.released or None,
            suppressed=done.suppressed or None,
            **dict(sorted(done.outcomes.items())),
        )
    if report is not None:
        report.add(done)
    if run.stop is not None:
        # the caller reports the line (a failed step, `digest sweep`'s `stopped:`); a log line here
        # at a louder level would only print it twice
        log_event("delivery_stopped", owner=deliverer.owner, why=run.stop)
        raise run.stop
    return done
