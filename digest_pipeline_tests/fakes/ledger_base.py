"""The fake ledger's records and the guarded move every role mixin shares, under one lock.

Each public method of a mixin holds `_lock` for its whole duration and computes every new record
before it changes anything, so a raised error leaves the ledger as it was (a rolled-back
transaction).
"""

import threading
from dataclasses import dataclass, replace
from datetime import datetime

from digest_pipeline.domain import transitions
from digest_pipeline.domain.errors import UnknownWorkItem
from digest_pipeline.domain.feedback import Suppression
from digest_pipeline.domain.model import (
    Attempt,
    AuditEntry,
    CleanupMode,
    DeadLetterRecord,
    DigestRow,
    Reopen,
    SnapshotEntry,
    SnapshotInfo,
    Transition,
    WorkItem,
)
from digest_pipeline.domain.periods import (
    DEFAULT_INSTANCE,
    OperationKey,
    Period,
    validate_instance_name,
)
from digest_pipeline.ports.feedback import FeedbackStore


@dataclass(frozen=True)
class CleanupRecord:
    """The unique cleanup row of one key (at most one, except via the test-only hook)."""

    key: OperationKey
    period: Period
    mode: CleanupMode
    rows: int
    claimed_at: datetime
    completed_at: datetime


@dataclass(frozen=True)
class ArchivedRow:
    """A generated row moved to the archive by an ARCHIVE cleanup."""

    row: DigestRow
    archived_at: datetime


class FakeLedgerBase:
    """The records every role mixin reads and writes, and the helpers they share."""

    def __init__(self, instance: str = DEFAULT_INSTANCE) -> None:
        #: the digest instance whose keys this ledger makes (the SQL ledger's `instance`)
        self._instance = validate_instance_name(instance)
        self._lock = threading.Lock()
        self._snapshots: dict[Period, SnapshotInfo] = {}
        self._entries: dict[Period, dict[str, SnapshotEntry]] = {}
        self._rows: dict[OperationKey, list[DigestRow]] = {}
        self._items: dict[OperationKey, WorkItem] = {}
        self._attempts: dict[int, Attempt] = {}
        self._dead_letters: list[DeadLetterRecord] = []
        self._audit: list[AuditEntry] = []
        self._cleanups: list[CleanupRecord] = []
        self._archived: list[ArchivedRow] = []
        self._transitions: list[Transition] = []
        self._attempt_seq = 0
        self._dead_letter_seq = 0
        self._audit_seq = 0
        self._suppressions: dict[str, Suppression] = {}
        #: the feedback store writing provider events for this ledger's keys, if any
        self.feedback: FeedbackStore | None = None
        #: a fake shop is the demo's (the public demo secret may sign its links) unless a test
        #: says it is a real one
        self.demo_data = True
        #: as a database server's ledger (`runtime.executor.WorksElsewhere`): its calls are safe
        #: from any thread (the lock above), so the runtime's overlapped paths (a ledger thread,
        #: cleanup pages in flight) run over it
        self.out_of_process = True

    @property
    def instance(self) -> str:
        return self._instance

    def _key_locked(self, period: Period, customer_id: str) -> OperationKey:
        return OperationKey(period, customer_id, self._instance)

    def _require_locked(self, key: OperationKey) -> WorkItem:
        item = self._items.get(key)
        if item is None:
            raise UnknownWorkItem(f"no work item for {key}")
        return item

    def _sorted_entries_locked(self, period: Period) -> list[SnapshotEntry]:
        return sorted(self._entries.get(period, {}).values(), key=lambda e: e.customer_id)

    def _append_audit_locked(self, entry: AuditEntry) -> None:
        self._audit_seq += 1
        self._audit.append(replace(entry, audit_id=self._audit_seq))

    def _apply_locked(self, t: Transition) -> None:
        """The guarded compare-and-set; validates everything before it changes anything."""
        updated = transitions.apply(self._require_locked(t.key), t)

        replayed: list[tuple[int, DeadLetterRecord]] = []
        if t.has(Reopen):  # a replay marks the key's dead letters replayed
            replayed = [
                (i, replace(d, replayed_at=t.at))
                for i, d in enumerate(self._dead_letters)
                if d.key == t.key and d.replayed_at is None
            ]
        dead_letter = None
        if t.dead_letter_reason:
            dead_letter = DeadLetterRecord(
                dead_letter_id=self._dead_letter_seq + 1,
                key=t.key,
                reason=t.dead_letter_reason,
                last_failure_class=updated.last_failure_class,
                attempts=updated.attempts,
                first_attempt_at=updated.first_attempt_at,
                last_attempt_at=updated.last_attempt_at,
                created_at=t.at,
                replayed_at=None,
            )
        audit = t.audit_entry()
        if audit is not None:
            audit = replace(audit, audit_id=self._audit_seq + 1)

        # Nothing below can raise: the "commit".
        self._items[t.key] = updated
        for i, d in replayed:
            self._dead_letters[i] = d
        if dead_letter is not None:
            self._dead_letter_seq = dead_letter.dead_letter_id
            self._dead_letters.append(dead_letter)
        if audit is not None:
            self._audit_seq = audit.audit_id
            self._audit.append(audit)
        self._transitions.append(t)
