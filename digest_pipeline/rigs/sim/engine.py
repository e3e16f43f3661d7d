"""One grid cell: a fresh period on a fresh ledger, delivered by the real services on virtual time.

`workers` delivery workers each loop over `deliver_due` (one claim of `batch_size` items at a
time, sent one after another, each send taking the provider's latency in virtual time), then
sleep until the next due time the ledger was given, so idle hours of backoff cost no wall time.
A worker that crashes restarts after `RESTART_DELAY` with a new owner name. Lease recovery
runs at the instant each claim's lease expires (the earliest a sweep could), so a lease shorter
than a batch really expires under a worker, through the ledger's own lease checks. Every `sweep_interval` the sweep reconciles
`unknown` items and cleans `sent` ones. The run ends when every item is terminal or `unknown`
with nothing left to settle it, and no worker holds a claim.
"""

import itertools
import logging
import random
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial

from sqlalchemy import Engine

from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.domain.model import Claim, CleanupMode
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.domain.retry import RandomSource
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.ports import Ledger
from digest_pipeline.rigs.sim.clock import VirtualClock
from digest_pipeline.rigs.sim.config import PERIOD, START, Cell, SimConfig
from digest_pipeline.rigs.sim.database import scratch_engine
from digest_pipeline.rigs.sim.faults import SimProvider, SimulatedCrash, unit
from digest_pipeline.rigs.sim.ledger import ObservedLedger
from digest_pipeline.rigs.sim.measure import OPEN, CellResult, Observations, measure
from digest_pipeline.rigs.sim.scheduler import Actor, ActorClock, Scheduler
from digest_pipeline.rigs.sim.shop import SimComposer, SimCustomers, digest_rows
from digest_pipeline.runtime.executor import executor_for
from digest_pipeline.services.cleanup import clean_period
from digest_pipeline.services.deliver import Deliverer, deliver_due
from digest_pipeline.services.enqueue import enqueue_period
from digest_pipeline.services.reconcile import reconcile_period
from digest_pipeline.services.snapshot import take_snapshot

#: a crashed worker process is back this long after it died
RESTART_DELAY = timedelta(seconds=5)
#: the simulation gives up here (the delivery window plus the unknown retention, with room),
#: reporting the cell as not drained
HORIZON = timedelta(days=15)
CLEANUP_MODE = CleanupMode.ARCHIVE
#: owner-name prefix of a redelivered (duplicate) claim
HANDOFF = "dup"

LedgerFactory = Callable[[Engine], Ledger]


def _no_jitter() -> float:
    """`rand` for `--no-jitter`: every delay is its bound."""
    return 1.0


@contextmanager
def _quiet_services() -> Iterator[None]:
    """The services log every lost race; in a simulation those are the point, and are counted."""
    logger = logging.getLogger("digest_pipeline")
    previous = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(previous)


@dataclass
class _Tally:
    """What the run itself keeps: the claims it redelivered, and when the period drained."""

    handoffs: list[str] = field(default_factory=list)
    pending_handoffs: int = 0
    drained_at: datetime | None = None


class Simulation:
    """One cell's world: virtual clock, scheduler, observed ledger, provider and workers."""

    def __init__(self, config: SimConfig, cell: Cell, ledger: Ledger) -> None:
        self.config, self.cell = config, cell
        self.clock = VirtualClock(START)
        self.sched = Scheduler(self.clock)
        self.policy = config.policy_for(cell)
        self.provider = SimProvider(config.faults, config.seed, self.sched, START)
        self.ledger = ObservedLedger(
            ledger,
            on_claims=self._claimed,
            on_due=self._due,
            lose_cleanup_ack=self._lose_cleanup_ack,
        )
        self.composer = SimComposer()
        self.tally = _Tally()
        self._busy = 0
        self._recoveries: set[datetime] = set()

    # -- randomness: every stream derives from the seed and the cell -------------------------
    def _rand(self, stream: str) -> RandomSource:
        if self.cell.no_jitter:
            return _no_jitter
        return random.Random(f"{self.config.seed}|{self.cell.label}|{stream}").random

    def _lose_cleanup_ack(self, key: OperationKey) -> bool:
        rate = self.config.faults.crash_after_cleanup_commit_rate
        return unit(self.config.seed, key, "cleanup_ack") < rate

    def _deliverer(self, actor: Actor, owner: str) -> Deliverer:
        return Deliverer(
            ledger=self.ledger,
            mailer=self.provider,
            composer=self.composer,
            clock=ActorClock(actor, self.clock),
            policy=self.policy,
            rand=self._rand(owner),
            owner=owner,
            executor=executor_for(self.ledger),
        )

    # -- events ----------------------------------------------------------------------------
    def _due(self, at: datetime) -> None:
        self.sched.call_at(at, self._wake_one)

    def _wake_one(self) -> None:
        """An item fell due: one idle worker gets up (a busy one claims it when it next looks)."""
        self.sched.wake(1)

    def _claimed(self, claims: list[Claim]) -> None:
        expires = claims[0].expires_at
        if expires not in self._recoveries:
            self._recoveries.add(expires)
            self.sched.call_at(expires, self._recover)
        rate = self.config.faults.duplicate_delivery_rate
        for claim in claims:
            if unit(self.config.seed, claim.key, claim.token, "handoff") < rate:
                self.tally.pending_handoffs += 1
                self.sched.call_at(claim.expires_at, partial(self._hand_off, claim))

    def _recover(self) -> None:
        self._recoveries.discard(self.clock.now())
        self.ledger.recover_expired_leases(self.clock.now())

    def _hand_off(self, claim: Claim) -> None:
        """An at-least-once queue redelivers the claim to a second worker as its lease runs out."""
        n = len(self.tally.handoffs)
        self.tally.handoffs.append(str(claim.key))

        def body(actor: Actor) -> None:
            try:
                self._deliverer(actor, f"{HANDOFF}{n:05d}").deliver_one(claim)
            except SimulatedCrash:
                pass
            finally:
                self.tally.pending_handoffs -= 1

        self.sched.spawn(f"{HANDOFF}{n}", body, self.clock.now())

    def _worker(self, index: int, actor: Actor) -> None:
        """A worker process: deliver what is due, sleep until more is; restart after a crash.

        One `Deliverer` (and so one jitter stream) lives as long as the process does.
        """
        for incarnation in itertools.count():
            deliverer = self._deliverer(actor, f"w{index:02d}.{incarnation}")
            while self._deliver(deliverer):
                self.sched.park()
            actor.crashed = False
            self.sched.sleep(RESTART_DELAY)

    def _deliver(self, deliverer: Deliverer) -> bool:
        """One `deliver_due` run; False if the worker's process died in it."""
        self._busy += 1
        try:
            deliver_due(deliverer, batch_size=self.config.batch_size, concurrency=1, period=PERIOD)
        except SimulatedCrash:
            return False  # its claims wait for their leases to run out
        finally:
            self._busy -= 1
        return True

    def _sweep(self) -> None:
        now = self.clock.now()
        counts = self.ledger.state_counts(PERIOD)
        if counts.get(DeliveryState.UNKNOWN):
            reconcile_period(self.ledger, self.provider, self.clock, self.policy, PERIOD)
        if counts.get(DeliveryState.SENT):
            self._clean()
        counts = self.ledger.state_counts(PERIOD)
        if not any(counts.get(s) for s in OPEN) and self._busy == 0:
            if self.tally.drained_at is None:
                self.tally.drained_at = now
            if self.tally.pending_handoffs == 0:
                self.sched.stop()
                return
        elif self.sched.parked and self.ledger.due_count(now, PERIOD):
            self.sched.wake(self.sched.parked)
        self.sched.call_at(now + self.config.sweep_interval, self._sweep)

    def _clean(self) -> None:
        while True:
            try:
                clean_period(self.ledger, self.clock, PERIOD, CLEANUP_MODE)
            except SimulatedCrash as crash:
                # The step is retried: its queue first redelivers the cleanup of the key whose
                # acknowledgement was lost, then the period's cleanup runs again.
                if crash.key is None:
                    raise
                self.ledger.clean_many([(crash.key, crash.token)], CLEANUP_MODE, self.clock.now())
                continue
            return

    # -- the run ---------------------------------------------------------------------------
    def open_period(self) -> None:
        """Freezes the period's selection, stores its rows and enqueues it, as the assets do."""
        take_snapshot(SimCustomers(self.config.customers), self.ledger, self.clock, PERIOD, "sim")
        self.ledger.add_digest_rows(digest_rows(PERIOD, self.config.customers))
        enqueue_period(self.ledger, self.clock, PERIOD)

    def run(self) -> bool:
        """Runs the period to its end; True if it drained before the horizon."""
        with _quiet_services():
            self.open_period()
            for index in range(self.cell.workers):
                self.sched.spawn(f"w{index:02d}", partial(self._worker, index), START)
            self.sched.call_at(START + self.config.sweep_interval, self._sweep)
            try:
                return self.sched.run(until=START + HORIZON)
            finally:
                self.sched.close()

    def observations(self, drained: bool) -> Observations:
        return Observations(
            cell=self.cell,
            customers=self.config.customers,
            start=START,
            finished_at=self.clock.now(),
            drained=drained,
            drained_at=self.tally.drained_at,
            lost_races=self.ledger.lost_races,
            late_results=self.ledger.late_results,
            handoff_keys=tuple(self.tally.handoffs),
            handoff_prefix=HANDOFF,
            cleanup_calls=self.ledger.cleanup_calls,
            cleanup_acks_lost=self.ledger.cleanup_acks_lost,
            released=self.ledger.released,
            recovered_requeued=self.ledger.recovered_requeued,
            recovered_unknown=self.ledger.recovered_unknown,
            backoff_wakes=Counter(self.ledger.backoff_wakes),
        )


def run_cell(
    config: SimConfig,
    cell: Cell,
    *,
    database_url: str | None = None,
    ledger_factory: LedgerFactory = SqlLedger,
) -> CellResult:
    """Simulates one cell on a fresh ledger and measures it from the provider and the ledger."""
    with scratch_engine(database_url) as engine:
        ledger = ledger_factory(engine)
        sim = Simulation(config, cell, ledger)
        drained = sim.run()
        return measure(sim.observations(drained), ledger, sim.provider)
