"""What a service is handed to run its loops: waves for delivery, tuning and writes for bulk runs.

The runtime layer (`digest_pipeline.runtime`) provides the executor the faces use: it runs a
worker's waves on threads, tunes the collector and keeps writes to a database server in flight.
`IN_TURN` does each bulk write on the caller's thread and tunes nothing; the results are the
same, only slower on a server.
"""

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from digest_pipeline.domain.errors import DigestError, SendingPaused
from digest_pipeline.domain.failures import SendOutcome
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.ports.ledger_roles import (
    Cleaner,
    ContentStore,
    HasSendBudget,
    ReadModel,
    SnapshotStore,
    SuppressionList,
    WorkQueue,
)
from digest_pipeline.ports.outside import Clock, Mailer
from digest_pipeline.services.wave import DeliveryReport

T = TypeVar("T")
W = TypeVar("W")


class Writes(Protocol):
    """Ledger writes in order: each one's `then` gets its answer, in the order they were made."""

    def submit(self, then: Callable[[T], None], write: Callable[..., T], *args: Any) -> None:
        """Starts `write(*args)`; its answer goes to `then` by the block's end at the latest."""

    def drain(self) -> None:
        """Takes every answer still to come, in order."""


class Executor(Protocol):
    """How a bulk service (snapshot, content, cleanup) runs its loop."""

    def bulk(self) -> AbstractContextManager[None]:
        """The process tuned for a bulk run while the block lasts."""

    def writes(self, limit: int, name: str) -> AbstractContextManager[Writes]:
        """Writes for the block, at most `limit` in flight; every answer is in by its end."""


class WritesInTurn:
    """Each write done and answered on the caller's thread before `submit` returns."""

    def submit(self, then: Callable[[T], None], write: Callable[..., T], *args: Any) -> None:
        then(write(*args))

    def drain(self) -> None:
        pass


class _InTurn:
    def bulk(self) -> AbstractContextManager[None]:
        return nullcontext()

    @contextmanager
    def writes(self, limit: int, name: str) -> Iterator[Writes]:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        yield WritesInTurn()


#: every write in turn on the caller's thread, the process left as it is
IN_TURN: Executor = _InTurn()


class WorkerLedger(
    SnapshotStore,
    ContentStore,
    WorkQueue,
    ReadModel,
    SuppressionList,
    HasSendBudget,
    Cleaner,
    Protocol,
):
    """What a delivery worker reads and moves; a worker's pass (services/pipeline.py) also cleans."""


@dataclass(frozen=True)
class DueRun(Generic[W]):
    """One `deliver_due` run as its executor takes it: the worker, what to claim, its bounds."""

    #: the worker (`services.deliver.Deliverer`; generic, so this module needs no import of it)
    deliverer: W
    #: None: every open period
    period: Period | None
    #: items one claim takes
    batch_size: int
    #: attempts open at once, at most (the install's pacing applied)
    concurrency: int
    #: claims this run may take in all (None: no cap)
    max_items: int | None
    #: asked before each claim; False ends the run's claiming
    should_continue: Callable[[], bool]
    #: consecutive same-code failures that stop the run (None or 0: never)
    breaker_threshold: int | None


class Pace(Protocol):
    """The install's pace as one worker's sends keep it: slots, the provider's pauses."""

    def start_run(self, concurrency: int) -> int:
        """The sends a run keeps in flight at this pace."""

    def stop(self) -> SendingPaused | None:
        """The stop of a run that a pause longer than a send may wait for holds, or None."""

    def send(self, transmit: Callable[[], SendOutcome]) -> SendOutcome:
        """Waits for the send's slot, sends, and records the pause the answer asks for."""


class DeliveryExecutor(Executor, Protocol):
    """Runs a worker's waves over its due items (runtime/waves.py) and paces their sends."""

    def pace(
        self, ledger: HasSendBudget, mailer: Mailer, policy: DeliveryPolicy, clock: Clock
    ) -> Pace | None:
        """The pace of a worker's sends through `mailer`; None for a ledger that keeps none."""

    def deliver(self, run: DueRun[Any], done: DeliveryReport) -> DigestError | None:
        """Claims and delivers until nothing is due or the run is bounded; counts into `done`.

        Returns why the run stopped early (a refused period, the open breaker, a pause), None
        when it ran out of work; every claim it took has a recorded state by then, and the
        claims it never attempted are given back due.
        """
