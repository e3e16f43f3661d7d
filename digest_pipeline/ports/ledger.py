"""The aggregate `Ledger` (the union of the role ports) and the feedback store `digest serve` uses."""

from abc import abstractmethod
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta

from digest_pipeline.domain.chunks import chunked
from digest_pipeline.domain.feedback import (
    EventClaim,
    EventOutcome,
    EventRecord,
    Suppression,
)
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.states import DELIVERED
from digest_pipeline.ports.ledger_roles import (
    AuditTrail,
    Cleaner,
    ContentStore,
    ReadModel,
    SecretFingerprints,
    SendBudget,
    SnapshotStore,
    SuppressionList,
    WorkQueue,
)


class Ledger(
    SnapshotStore, ContentStore, WorkQueue, Cleaner, ReadModel, AuditTrail, SuppressionList
):
    """The source of truth: every role above, over one database (design §5).

    The adapters implement it whole; a service names the roles it uses in its signature where
    it needs fewer. Implementations must be safe to call from many threads.
    """

    #: Whether the ledger's work runs outside this process (a database server), so a caller
    #: gains by overlapping its own Python with a call on another thread. SQLite's work is
    #: this process's own CPU: overlapping it only adds lock waits.
    out_of_process: bool = False

    @property
    @abstractmethod
    def secret_fingerprints(self) -> SecretFingerprints:
        """The fingerprints of the signing secrets, kept in this same ledger."""

    @property
    def send_budget(self) -> SendBudget | None:
        """The install's send slots and pause in this ledger; None: unpaced, no shared pause."""
        return None

    def recipe(self) -> "Callable[[], Ledger] | None":
        """How a forked helper opens this same ledger (a zero-argument call); None: it cannot.

        The ledger it opens must refuse to be another one: a helper that cannot see the run's
        ledger fails instead of working on a different database.
        """
        return None

    def iter_needing_content(self, period: Period, page: int = 5_000) -> Iterator[str]:
        """The frozen customer ids, in order, that content generation must write rows for.

        Those with no live rows whose item is neither sent nor cleaned (or who have no item
        yet). Streamed a page at a time, each page read once the caller is done with the one
        before; the SQL ledger answers a page in one statement, this default in three.
        """
        entries = self.iter_snapshot_entries(period, page=page)
        for chunk in chunked(entries, page):
            keys = [OperationKey(period, e.customer_id) for e in chunk]
            has_rows = self.keys_with_rows_of(keys)
            fresh = [k for k in keys if k not in has_rows]
            done = {k for k, item in self.items_of(fresh).items() if item.state in DELIVERED}
            yield from (k.customer_id for k in fresh if k not in done)


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
