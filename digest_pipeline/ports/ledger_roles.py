"""The ledger's role ports: each a part of what the ledger records, used on its own by a service.

They are structural (`Protocol`s), so a service names only the roles it uses and any ledger
with those methods serves it. The SQL ledger and the tests' fake subclass every one explicitly,
so a missing method fails when they are made; the contract suite holds the two to the same tests.
"""

from abc import abstractmethod
from collections.abc import Collection, Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Protocol

from digest_pipeline.domain.errors import DigestError
from digest_pipeline.domain.failures import SendOutcome
from digest_pipeline.domain.feedback import (
    FeedbackCounts,
    Suppression,
)
from digest_pipeline.domain.fingerprints import FingerprintRecord
from digest_pipeline.domain.model import (
    Attempt,
    AttemptTicket,
    AuditEntry,
    Claim,
    CleanupMode,
    CleanupReceipt,
    DeadLetterRecord,
    DigestRow,
    EnqueueReceipt,
    InvariantResult,
    ItemLease,
    ItemTimes,
    LeaseRecovery,
    SnapshotEntry,
    SnapshotInfo,
    SnapshotReceipt,
    Transition,
    WorkItem,
)
from digest_pipeline.domain.pacing import Pause, Slot
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.regeneration import RowReplacement
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.domain.timing import ItemTimeSummary, summarize_item_times


class SnapshotStore(Protocol):
    """The frozen eligibility selection of each period and the addresses it froze."""

    @abstractmethod
    def freeze_snapshot(
        self, period: Period, run_id: str, selected_at: datetime, entries: Iterable[SnapshotEntry]
    ) -> SnapshotReceipt:
        """Freezes the period's selection once; a later call reuses the first and says so."""

    @abstractmethod
    def snapshot(self, period: Period) -> SnapshotInfo | None:
        """The frozen selection's header, or None before the freeze."""

    @abstractmethod
    def snapshot_entries(self, period: Period) -> list[SnapshotEntry]:
        """The frozen selection, ordered by customer id."""

    def iter_snapshot_entries(self, period: Period, page: int = 1_000) -> Iterator[SnapshotEntry]:
        """`snapshot_entries`, streamed a page at a time, so a million entries never sit in memory.

        The SQL ledger pages by customer id (in the database's order); this default reads them all.
        """
        yield from self.snapshot_entries(period)

    @abstractmethod
    def holds_demo_data(self) -> bool:
        """Whether `digest seed` wrote demo data here: only then is the public demo secret used."""

    @abstractmethod
    def suppressed_ids(self) -> frozenset[str]:
        """The customer ids on the suppression list: the eligibility gate leaves them out."""

    @abstractmethod
    def recipients(self, keys: Sequence[OperationKey]) -> dict[OperationKey, str]:
        """The address frozen for each key's customer in its period; keys without one are absent."""


class ContentStore(Protocol):
    """The generated digest rows of each operation key, until cleanup removes them."""

    @abstractmethod
    def add_digest_rows(self, rows: Iterable[DigestRow]) -> int:
        """Stores generated rows; returns how many were written."""

    @abstractmethod
    def digest_rows_of(self, keys: Sequence[OperationKey]) -> dict[OperationKey, list[DigestRow]]:
        """Each key's live (not cleaned) generated rows, by position; every key present."""

    def keys_with_rows_of(self, keys: Sequence[OperationKey]) -> set[OperationKey]:
        """Those of `keys` that have live generated rows (without reading the rows)."""
        return {k for k, rows in self.digest_rows_of(keys).items() if rows}

    @abstractmethod
    def keys_with_rows(self, period: Period) -> set[OperationKey]:
        """The period's keys that have live generated rows."""

    def replace_digest_rows(
        self, keys: Sequence[OperationKey], rows: Iterable[DigestRow]
    ) -> RowReplacement:
        """Replaces the live rows of `keys` with `rows`, for never-sent items only, atomically.

        In one transaction, a compare-and-set on each key's state: a key whose work item is in
        `REGENERABLE` (pending, retry_scheduled, failed, dead_lettered) has its live rows
        deleted and its rows of `rows` written; any other key (claimed, sent, cleaned, unknown,
        or no item) is refused and nothing of it changes. A key may get no new rows. Item
        states never change.

        Not abstract, so a wrapper that has no use for it still instantiates; there is no
        default, since only the ledger itself can make the check and the write one transaction.

        Raises:
            ValueError: a row's key is not among `keys`; nothing changes.
            NotImplementedError: this ledger cannot replace rows.
        """
        # More than a bare raise: type checkers take a protocol method whose body is only one as
        # abstract, and this one must not be.
        kind = type(self).__name__
        raise NotImplementedError(f"{kind} cannot replace digest rows")


class WorkQueue(Protocol):
    """The work items as a queue: enqueue, claim with a fencing token, attempt, move.

    Every state change is a compare-and-set on (operation key, expected state, lease token);
    zero matched rows raise LostRace.
    """

    @abstractmethod
    def enqueue(self, period: Period, now: datetime) -> EnqueueReceipt:
        """Creates one `pending` item per snapshot entry that has none; idempotent."""

    @abstractmethod
    def claim_due(
        self,
        now: datetime,
        owner: str,
        lease: timedelta,
        limit: int,
        period: Period | None = None,
    ) -> list[Claim]:
        """Leases up to `limit` due items (`pending`, or `retry_scheduled` with a due time).

        Each claim carries a fresh fencing token; concurrent callers never get the same item.
        """

    @abstractmethod
    def due_count(self, now: datetime, period: Period | None = None) -> int:
        """How many items `claim_due` could hand out now (optionally in one period)."""

    # A delivery worker moves a wave of sends at a time: one transaction per wave, never one
    # per item. Only the batch forms are the port's; the tests' builders wrap them for one item.
    @abstractmethod
    def start_attempts(
        self, claims: Sequence[Claim], now: datetime, *, mailer: str
    ) -> list[AttemptTicket | DigestError]:
        """Records each claim's attempt as started through `mailer`, before it is called, in order.

        `mailer` is the sending mailer's identity (`Mailer.identity`), kept on the attempt so
        that evidence about it comes only from that mailer. The lease must be live and the
        customer not suppressed: in the same transaction, a claim whose customer is on the
        suppression list ends `suppressed` without an attempt. A claim that cannot start gets
        its error (LostRace, UnknownWorkItem) instead of a ticket.
        """

    @abstractmethod
    def complete_many(
        self, results: Sequence[tuple[AttemptTicket, SendOutcome, Transition]]
    ) -> list[DigestError | None]:
        """Closes each attempt with its outcome and applies its transition, atomically.

        Returns, in order, None where the transition applied, else its error (LostRace): every
        attempt is closed either way, as evidence for reconciliation.
        """

    def record_and_start(
        self,
        results: Sequence[tuple[AttemptTicket, SendOutcome, Transition]],
        claims: Sequence[Claim],
        now: datetime,
        *,
        mailer: str,
    ) -> tuple[list[DigestError | None], list[AttemptTicket | DigestError]]:
        """`complete_many(results)`, then `start_attempts(claims, now, mailer=…)`, as one step.

        A worker records the waves that finished and starts the next ones with it.
        A database ledger does both in one transaction (one commit a wave, not two); the
        attempts it closes are closed before the ones it starts are opened, so a worker's open
        attempts never add up to more than the two calls would hold.
        """
        return self.complete_many(results), self.start_attempts(claims, now, mailer=mailer)

    @abstractmethod
    def apply(self, transition: Transition) -> None:
        """Applies one guarded transition that closes no attempt."""

    @abstractmethod
    def recover_expired_leases(self, now: datetime) -> LeaseRecovery:
        """Expired claims with no open attempt become due again; with one open, `unknown`."""

    @abstractmethod
    def cancel_suppressed(self, now: datetime, period: Period | None = None) -> list[OperationKey]:
        """Ends the never-claimed items (pending, retry_scheduled) of suppressed customers.

        Each becomes `suppressed` with an audit row, in `period` or (None) every period. An item
        enqueued from a snapshot frozen before its customer's suppression is caught here,
        before a delivery run claims anything. Returns their keys.
        """


class Cleaner(Protocol):
    """Cleanup of a sent item's rows: claimed and completed atomically, at most once per key."""

    @abstractmethod
    def clean_many(
        self, items: Sequence[tuple[OperationKey, int]], mode: CleanupMode, now: datetime
    ) -> list[CleanupReceipt | DigestError]:
        """Cleans each (key, lease token), in order.

        For each key: claims the cleanup (the unique cleanup row), archives or deletes the key's
        rows and moves the item `sent → cleaned`, atomically. A key already cleaned reports
        `already_cleaned`; an item that is not `sent` with that token gets LostRace (and
        UnknownWorkItem when there is none), and nothing of it changes.
        """


class ReadModel(Protocol):
    """What status, checks, metrics, the simulator, benchmarks and chaos counts read."""

    @abstractmethod
    def feedback_counts(self, period: Period) -> FeedbackCounts:
        """The week's unsubscribes, hard bounces and complaints (`domain.feedback`)."""

    @abstractmethod
    def get(self, key: OperationKey) -> WorkItem | None:
        """One item, or None."""

    def items_of(self, keys: Sequence[OperationKey]) -> dict[OperationKey, WorkItem]:
        """`get` for many keys; keys without an item are absent."""
        found = {k: self.get(k) for k in keys}
        return {k: i for k, i in found.items() if i is not None}

    @abstractmethod
    def items(
        self, period: Period, states: Iterable[DeliveryState] | None = None
    ) -> list[WorkItem]:
        """A period's items, optionally only in some states, ordered by operation key."""

    def iter_items(
        self, period: Period, states: Iterable[DeliveryState] | None = None, page: int = 1_000
    ) -> Iterator[WorkItem]:
        """`items`, streamed a page at a time, so a million items never sit in memory together.

        The SQL ledger pages by customer id (key order, within one period); this default reads
        them all.
        """
        yield from self.items(period, states)

    def iter_item_times(self, period: Period) -> Iterator[ItemTimes]:
        """Every item's state and times (`ItemTimes`), streamed; the SQL ledger reads five columns."""
        for item in self.iter_items(period):
            yield ItemTimes.of(item)

    def item_time_summary(self, period: Period) -> ItemTimeSummary:
        """The period's claim delays, cleanup lags and oldest waiting item (`ItemTimeSummary`).

        This default passes over `iter_item_times` in Python; the SQL ledger answers in one
        statement on either database, to the same numbers (a contract test holds it to this).
        """
        return summarize_item_times(self.iter_item_times(period))

    def iter_item_leases(self, period: Period, page: int = 1_000) -> Iterator[ItemLease]:
        """Every item's key, state and token (`ItemLease`), streamed in key order.

        Read `page` at a time; the SQL ledger reads those columns only.
        """
        for item in self.iter_items(period, page=page):
            yield ItemLease.of(item)

    @abstractmethod
    def attempts(self, key: OperationKey) -> list[Attempt]:
        """The attempt history of one key, oldest first."""

    @abstractmethod
    def state_counts(self, period: Period) -> dict[DeliveryState, int]:
        """Items per state (states with no item are absent)."""

    @abstractmethod
    def attempt_outcome_counts(self, period: Period) -> dict[str, int]:
        """Attempts per recorded outcome (`sent`, failure classes, `open`, `duplicate`)."""

    @abstractmethod
    def open_periods(self) -> list[Period]:
        """Periods with items the system must still act on (any state but cleaned, failed, dead-lettered)."""

    @abstractmethod
    def dead_letters(self, period: Period) -> list[DeadLetterRecord]:
        """The period's dead-letter rows, oldest first."""

    @abstractmethod
    def audit_log(self, period: Period | None = None) -> list[AuditEntry]:
        """Audit rows, oldest first."""

    @abstractmethod
    def check_invariants(
        self, period: Period, now: datetime, names: Collection[str] | None = None
    ) -> list[InvariantResult]:
        """Design §4's invariants evaluated on what is recorded for the period.

        Args:
            period: the period to check.
            now: the time a lease counts as expired against.
            names: evaluate only these invariants (by `INVARIANTS` name); all when None.
        """


class AuditTrail(Protocol):
    """Operator and system actions that are not moves of an item (moves carry their own note)."""

    @abstractmethod
    def record_audit(self, entry: AuditEntry) -> None:
        """Appends one audit row."""


class SecretFingerprints(Protocol):
    """The fingerprints of the secrets that signed what customers hold (design §8), per purpose.

    One record per purpose (domain/fingerprints.py). It is made once, by the first process
    that signs or checks links, and changed only by an audited rotation, as a compare-and-set.
    """

    @abstractmethod
    def fingerprint_record(self, purpose: str) -> FingerprintRecord | None:
        """The purpose's record, or None before any process used a secret for it."""

    @abstractmethod
    def record_first_fingerprint(
        self, purpose: str, fingerprint: str, at: datetime
    ) -> FingerprintRecord:
        """The purpose's record, made with `fingerprint` as current if there is none yet.

        Concurrent first uses agree: one of them records, and all get that record back.
        """

    @abstractmethod
    def rotate_fingerprint(
        self, after: FingerprintRecord, expected: str | None, audit: AuditEntry
    ) -> bool:
        """Replaces the purpose's record by `after` and appends `audit`, in one transaction.

        Only while the current fingerprint is still `expected` (None: no record yet); False,
        with nothing written, when another process got there first.
        """


class SuppressionList(Protocol):
    """The customers who get no more digests: one row per customer id, no address."""

    @abstractmethod
    def suppress(self, suppression: Suppression, note: str = "") -> bool:
        """Adds the customer to the list, once (the first reason wins), with an audit row.

        In the same transaction their items of every week whose attempt has not started end as
        `suppressed`: unclaimed ones, and claimed ones whose wave has not started (a start in
        progress is waited for). An item whose attempt started is in flight and is left to its
        worker. `note` is the audit row's reason beside the suppression's own (an operator's
        text). False, and nothing written, when the customer was on the list already.
        """

    @abstractmethod
    def unsuppress(self, customer_id: str, at: datetime, actor: str, reason: str) -> bool:
        """Takes the customer off the list, with an audit row; False when they were not on it.

        Their later weeks' snapshots select them again; items already `suppressed` stay so.
        """

    @abstractmethod
    def suppressions(self) -> list[Suppression]:
        """The suppression list, by customer id."""


class SendBudget(Protocol):
    """The install's shared send slots and pause, per mailer identity (domain/pacing.py).

    It lives where every sender of the install reaches it, the ledger's database: a step's
    threads, its helper processes, other `digest` processes and Celery workers take their
    slots from one row, and one sender's pause holds them all.
    """

    @abstractmethod
    def take_slot(self, mailer: str, interval: timedelta, now: datetime) -> Slot:
        """Takes the mailer's next send slot if it is free at `now`, in one atomic step.

        A slot is free once the last one taken is `interval` old and no pause lasts. A slot
        taken up to `domain.pacing.SLACK` late keeps the schedule; a later one starts it anew.
        Not taken: the answer says when the next slot is free.
        """

    @abstractmethod
    def pause(self, mailer: str, pause: Pause) -> None:
        """Holds every sender through the mailer until `pause.until` (a pause only lengthens)."""

    @abstractmethod
    def current_pause(self, mailer: str) -> Pause | None:
        """The mailer's latest pause, ended or not; None if it was never paused."""


class ContentBacklog(Protocol):
    """The frozen customers that content generation has still to write rows for."""

    @property
    @abstractmethod
    def instance(self) -> str:
        """The digest instance this ledger belongs to: the first part of each of its keys."""

    @abstractmethod
    def iter_needing_content(self, period: Period, page: int = 5_000) -> Iterator[str]:
        """The frozen customer ids, in order, with no live rows and no item sent or cleaned.

        Streamed a page at a time, each page read once the caller is done with the one before.
        """


class HasSecretFingerprints(Protocol):
    """A ledger that keeps the fingerprints of the signing secrets beside its records."""

    @property
    @abstractmethod
    def secret_fingerprints(self) -> SecretFingerprints:
        """The fingerprints of the signing secrets, kept in this same ledger."""


class HasSendBudget(Protocol):
    """A ledger that may keep the install's shared send slots and pause."""

    @property
    @abstractmethod
    def send_budget(self) -> SendBudget | None:
        """The install's send slots and pause in this ledger; None: unpaced, no shared pause."""
