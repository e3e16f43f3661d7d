"""The feedback store `digest serve` records into: the suppression list and the provider events.

It is its own port, beside the ledger's roles, so the services that answer links and webhooks
name it without the aggregate `Ledger`.
"""

from abc import abstractmethod
from datetime import datetime, timedelta

from digest_pipeline.domain.feedback import (
    EventClaim,
    EventOutcome,
    EventRecord,
    Suppression,
)
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.ports.ledger_roles import SuppressionList


class FeedbackStore(SuppressionList):
    """What `digest serve` records: the suppression list and the provider events.

    Both are idempotent by their keys: one suppression per customer (the first reason wins) and
    one event per (provider, event id). Neither holds an address or message content.
    """

    @property
    @abstractmethod
    def suppression_list(self) -> SuppressionList:
        """The ledger's list, which this store's is: its cancellations and audit rows go with it."""

    def suppress(self, suppression: Suppression, note: str = "") -> bool:
        return self.suppression_list.suppress(suppression, note)

    def unsuppress(self, customer_id: str, at: datetime, actor: str, reason: str) -> bool:
        return self.suppression_list.unsuppress(customer_id, at, actor, reason)

    def suppressions(self) -> list[Suppression]:
        return self.suppression_list.suppressions()

    @abstractmethod
    def known_customer(self, customer_id: str) -> bool:
        """Whether the shop's source or any frozen snapshot knows the customer id."""

    @abstractmethod
    def key_of_provider_message(self, provider_message_id: str) -> OperationKey | None:
        """The operation key whose attempt the provider gave this message id, if any."""

    @abstractmethod
    def begin_event(self, record: EventRecord, lease: timedelta) -> EventClaim:
        """Records the event as `received` once per (provider, event id), or says why not.

        NEW and RESUMED let the caller apply it (a `received` row older than `lease` is an
        abandoned one, taken over with a compare-and-set on its time); IN_PROGRESS means another
        request holds it; DONE carries the outcome recorded before.
        """

    @abstractmethod
    def finish_event(self, provider: str, event_id: str, outcome: EventOutcome) -> None:
        """Records the outcome of a `received` event (only the first finish counts)."""

    @abstractmethod
    def provider_events(self) -> list[EventRecord]:
        """Every recorded event, by provider and event id."""
