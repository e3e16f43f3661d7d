"""The `FeedbackStore` in memory, with the SQL store's guards (style §5, "Fakes, not mocks").

The suppression list is the fake ledger's, as the SQL store's is the SQL ledger's. One event per
(provider, event id), the `received` lease taken over only by a compare-and-set on its time, all
under one lock. It reads
customers from the constructor and from the ledger's snapshots of `periods`, and message ids
from the attempts of those periods' items, which is what the SQL store reads from its tables.
The contract tests (`contract/test_feedback_store_contract.py`) hold the two to the same tests.
"""

import threading
from collections.abc import Iterable
from dataclasses import replace
from datetime import timedelta

from digest_pipeline.domain.feedback import (
    ClaimStatus,
    EventClaim,
    EventOutcome,
    EventRecord,
)
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.ports import FeedbackStore, Ledger
from digest_pipeline.rigs.seeding import W42
from digest_pipeline_tests.fakes import FakeLedger


class FakeFeedbackStore(FeedbackStore):
    def __init__(
        self,
        ledger: Ledger,
        *,
        customers: Iterable[str] = (),
        periods: Iterable[Period] = (W42,),
    ) -> None:
        self._ledger = ledger
        self._customers = frozenset(customers)
        self._periods = tuple(periods)
        self._lock = threading.Lock()
        self._events: dict[tuple[str, str], EventRecord] = {}
        if isinstance(ledger, FakeLedger):
            ledger.feedback = self  # its weekly counts read these events, as SQL reads the table

    def known_customer(self, customer_id: str) -> bool:
        if customer_id in self._customers:
            return True
        return any(
            e.customer_id == customer_id
            for p in self._periods
            for e in self._ledger.snapshot_entries(p)
        )

    @property
    def suppression_list(self) -> Ledger:
        return self._ledger

    def key_of_provider_message(self, provider_message_id: str) -> OperationKey | None:
        latest: tuple[int, OperationKey] | None = None
        for period in self._periods:
            for item in self._ledger.items(period):
                for a in self._ledger.attempts(item.key):
                    if a.provider_message_id == provider_message_id and (
                        latest is None or a.attempt_id > latest[0]
                    ):
                        latest = (a.attempt_id, a.key)
        return None if latest is None else latest[1]

    def begin_event(self, record: EventRecord, lease: timedelta) -> EventClaim:
        ident = (record.provider, record.event_id)
        with self._lock:
            found = self._events.get(ident)
            if found is None:
                self._events[ident] = record
                return EventClaim(ClaimStatus.NEW)
            if found.outcome is not EventOutcome.RECEIVED:
                return EventClaim(ClaimStatus.DONE, found.outcome)
            if found.received_at > record.received_at - lease:
                return EventClaim(ClaimStatus.IN_PROGRESS)
            self._events[ident] = replace(
                found, received_at=record.received_at, operation_key=record.operation_key
            )
            return EventClaim(ClaimStatus.RESUMED)

    def finish_event(self, provider: str, event_id: str, outcome: EventOutcome) -> None:
        with self._lock:
            found = self._events.get((provider, event_id))
            if found is not None and found.outcome is EventOutcome.RECEIVED:
                self._events[(provider, event_id)] = replace(found, outcome=outcome)

    def provider_events(self) -> list[EventRecord]:
        with self._lock:
            return [self._events[k] for k in sorted(self._events)]
