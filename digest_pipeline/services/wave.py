"""What one delivery worker's waves carry: the claims, their messages, their sends, their states.

A wave is the unit the ledger sees: one call records its attempts as started, one records their
outcomes. How many waves are in flight, and on which threads their sends run, is the runtime's
business (`digest_pipeline.runtime`); a send is anything that is `done` and has a `result`.
"""

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from digest_pipeline.domain.failures import SendOutcome
from digest_pipeline.domain.model import AttemptTicket, Claim, DigestRow, Message
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.states import NotRecorded, Settled

LOST_RACE = NotRecorded.LOST_RACE
RELEASED = NotRecorded.RELEASED


class Sending(Protocol):
    """A send under way on another thread (a pool's future)."""

    def done(self) -> bool: ...

    def result(self) -> SendOutcome: ...


class SendPool(Protocol):
    """Where a remote mailer's sends run beside the worker's thread (a thread pool)."""

    def submit(self, fn: Callable[[Message], SendOutcome], message: Message, /) -> Sending: ...


def outcome_of(send: Sending | SendOutcome) -> SendOutcome:
    """The send's outcome, waiting for it if it is still under way."""
    return send if isinstance(send, SendOutcome) else send.result()


def finished(send: Sending | SendOutcome) -> bool:
    """Whether the send's outcome is in."""
    return isinstance(send, SendOutcome) or send.done()


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
class Started:
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
    started: list[tuple[int, Started]] = field(default_factory=list)
    #: the started claims' messages (or failures instead) not yet handed to `dispatch`
    unsent: list[Message | SendOutcome] = field(default_factory=list)
    #: each started claim's send: under way on a pool, or the outcome of one that ran inline
    sends: list[Sending | SendOutcome] = field(default_factory=list)
    #: the started claims' outcomes, in order, once the sends are done (`Deliverer.collect`)
    outcomes: list[SendOutcome] = field(default_factory=list)
    #: periods whose claims were given back unsent because the snapshot changed, with the line
    refused: dict[Period, str] = field(default_factory=dict)

    def states(self) -> list[Settled]:
        """Each claim's state, in the order the claims came (once the wave is recorded)."""
        return [self.settled[i] for i in range(len(self.claims))]
