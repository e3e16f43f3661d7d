"""The wave engine: a worker's claims, waves in flight, and the threads they send and record on.

`depth` waves overlap: while some waves' sends are in flight, the worker's thread records the
outcomes of the wave that finished and starts the next; together they never hold more than
`concurrency` open attempts, and each exchange starts one wave. The use case's steps (prepare,
exchange, collect) are the `Deliverer`'s (services/deliver.py); this module decides when each runs.
"""

from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime

from digest_pipeline.domain.breaker import Breaker
from digest_pipeline.domain.errors import BreakerOpen, DigestError, SendingPaused, SnapshotTampered
from digest_pipeline.domain.model import Claim
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.waves import AHEAD_WAVES, wave_shape
from digest_pipeline.runtime.tuning import fewer_collections, prompt_handover
from digest_pipeline.services.deliver import Deliverer
from digest_pipeline.services.executor import DueRun
from digest_pipeline.services.wave import Content, DeliveryReport, Wave, finished


@dataclass
class WaveRun:
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
            (block and not taken) or all(finished(f) for f in self.in_flight[0].sends)
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


def run_waves(
    run: DueRun[Deliverer], done: DeliveryReport, *, out_of_process: bool
) -> DigestError | None:
    """Runs `run` to its end, counting into `done`; returns why it stopped early, or None.

    `out_of_process`: the ledger works on a database server, so a call on another thread
    overlaps this thread's Python instead of taking turns with it.
    """
    deliverer = run.deliverer
    remote = deliverer.mailer.capabilities.remote
    size, depth = wave_shape(run.concurrency, remote)
    waves = WaveRun(
        deliverer,
        run.period,
        Breaker(run.breaker_threshold),
        size,
        depth,
        run.batch_size,
        run.max_items,
        run.should_continue,
        done,
    )
    # Over a database server, the next claim is taken on a thread of its own while the queue's
    # last waves are composed (`WaveRun.claim_ahead`); on SQLite, once the queue is empty.
    # When the breaker holds a claim or a wave back, the oldest wave in flight is recorded
    # first: its outcomes say whether the provider takes our messages.
    # A local mailer's send ends before the ledger could record anything (a file link, a
    # memory write): it runs here, in turn, without a pool's future and lock for each message.
    # With a remote mailer this thread composes while the sends are out; with a local one
    # there is nothing out, so, over a database server, it composes while the ledger thread
    # records and starts (with a prompt GIL handover: the ledger thread needs it between
    # statements). The ledger thread helps a local run on PostgreSQL, and slows a
    # remote one (whose pool threads wait for the GIL too) and any run on SQLite.
    overlap = not remote and out_of_process
    # the claim taken ahead pays on both loops over a database server, a latency-bound run's
    # included: the next claim is ready before the queue empties
    with (
        fewer_collections(),
        ThreadPoolExecutor(max_workers=run.concurrency) if remote else nullcontext() as pool,
        prompt_handover() if overlap else nullcontext(),
        ThreadPoolExecutor(1, "ledger") if overlap else nullcontext() as waves.ledger_thread,
        ThreadPoolExecutor(1, "claims") if out_of_process else nullcontext() as waves.claim_thread,
    ):
        while waves.stop is None and waves.step(pool):
            pass
        waves.drain()
    waves.give_back_queued()
    return waves.stop
