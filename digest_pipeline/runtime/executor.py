"""The executor the faces hand the services: waves on threads, overlapped writes, a tuned heap.

Whether the ledger works outside this process decides the overlap, so the composition root
builds one executor per ledger (`executor_for`); the services see only the protocols of
services/executor.py and services/deliver.py.
"""

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from digest_pipeline.domain.errors import DigestError
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.ports.ledger_roles import HasSendBudget
from digest_pipeline.ports.outside import Clock, Mailer
from digest_pipeline.runtime.overlap import overlapped_writes
from digest_pipeline.runtime.pacing import Pacer, pacer_for
from digest_pipeline.runtime.tuning import fewer_collections
from digest_pipeline.runtime.waves import run_waves
from digest_pipeline.services.deliver import Deliverer
from digest_pipeline.services.executor import DeliveryExecutor, DueRun, Writes
from digest_pipeline.services.wave import DeliveryReport


@runtime_checkable
class WorksElsewhere(Protocol):
    """A ledger that says whether its work runs outside this process (the SQL ledger does)."""

    #: True for a database server: a caller gains by overlapping its own Python with a call on
    #: another thread. SQLite's work is this process's own CPU: overlapping it only adds waits.
    out_of_process: bool


@dataclass(frozen=True)
class ThreadedExecutor:
    """Delivery waves on thread pools, bulk writes in flight on threads over a database server."""

    out_of_process: bool

    def bulk(self) -> AbstractContextManager[None]:
        return fewer_collections()

    def writes(self, limit: int, name: str) -> AbstractContextManager[Writes]:
        return overlapped_writes(limit, self.out_of_process, name)

    def deliver(self, run: DueRun[Deliverer], done: DeliveryReport) -> DigestError | None:
        return run_waves(run, done, out_of_process=self.out_of_process)

    def pace(
        self, ledger: HasSendBudget, mailer: Mailer, policy: DeliveryPolicy, clock: Clock
    ) -> Pacer | None:
        return pacer_for(ledger, mailer, policy, clock)


def executor_for(ledger: object) -> DeliveryExecutor:
    """The executor for a ledger: overlapping only when its work runs outside this process."""
    return ThreadedExecutor(isinstance(ledger, WorksElsewhere) and ledger.out_of_process)
