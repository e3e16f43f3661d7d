"""The fake ledger: the role mixins composed into one `Ledger`, as the SQL ledger composes its own.

It enforces what the SQL ledger enforces (one work item per operation key, one cleanup per key,
every state change a compare-and-set on key, expected state and lease token); the contract suite
runs the same tests over both, so its semantics are the contract.
"""

import threading
from dataclasses import replace
from datetime import datetime

from digest_pipeline.domain.fingerprints import FingerprintRecord
from digest_pipeline.domain.model import AuditEntry, CleanupMode, Transition
from digest_pipeline.domain.periods import DEFAULT_INSTANCE, OperationKey
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.ports.ledger import Ledger
from digest_pipeline.ports.ledger_roles import AuditTrail, SecretFingerprints
from digest_pipeline_tests.fakes.ledger_base import ArchivedRow, CleanupRecord
from digest_pipeline_tests.fakes.ledger_cleanup import FakeCleaner
from digest_pipeline_tests.fakes.ledger_content import FakeContent
from digest_pipeline_tests.fakes.ledger_invariants import FakeInvariants
from digest_pipeline_tests.fakes.ledger_read_model import FakeReadModel
from digest_pipeline_tests.fakes.ledger_snapshots import FakeSnapshots
from digest_pipeline_tests.fakes.ledger_suppressions import FakeSuppressions


class FakeSecretFingerprints(SecretFingerprints):
    """The fingerprint records in memory; a rotation's audit row goes to `audit` under the lock."""

    def __init__(self, audit: AuditTrail) -> None:
        self._lock = threading.Lock()
        self._audit = audit
        self._records: dict[str, FingerprintRecord] = {}

    def fingerprint_record(self, purpose: str) -> FingerprintRecord | None:
        with self._lock:
            return self._records.get(purpose)

    def record_first_fingerprint(
        self, purpose: str, fingerprint: str, at: datetime
    ) -> FingerprintRecord:
        with self._lock:
            return self._records.setdefault(purpose, FingerprintRecord(purpose, fingerprint, at))

    def rotate_fingerprint(
        self, after: FingerprintRecord, expected: str | None, audit: AuditEntry
    ) -> bool:
        with self._lock:
            found = self._records.get(after.purpose)
            if (found is None) != (expected is None):
                return False
            if found is not None and found.current != expected:
                return False
            self._audit.record_audit(audit)
            self._records[after.purpose] = after
            return True


class FakeLedger(
    FakeSnapshots, FakeContent, FakeSuppressions, FakeCleaner, FakeReadModel, FakeInvariants, Ledger
):
    """The ledger in memory, with the SQL ledger's guards, plus the tests' inspection hooks.

    Every public method holds one lock for its whole duration and computes every new record
    before it changes anything, so a raised error leaves the ledger unchanged (a SQL transaction
    that rolled back). `complete_many` is the one exception by design: an attempt is closed even
    if its transition then loses its race, because the closed attempt is evidence for
    reconciliation.
    """

    def __init__(self, instance: str = DEFAULT_INSTANCE) -> None:
        super().__init__(instance)
        self._fingerprints = FakeSecretFingerprints(self)

    @property
    def secret_fingerprints(self) -> SecretFingerprints:
        return self._fingerprints

    def open_attempt_count(self, worker: str) -> int:
        """Attempts `worker` has started and not yet recorded, at one instant.

        One lock hold for the whole count: summing `attempts(key)` item by item takes the lock
        per item, and while that walk goes on a worker can record one wave and start the next,
        so the walk would add up attempts that were never open together.
        """
        with self._lock:
            return sum(
                1 for a in self._attempts.values() if a.worker == worker and a.finished_at is None
            )

    def attempt_count(self, worker: str) -> int:
        """Attempts `worker` has started, open or recorded, at one instant (one lock hold)."""
        with self._lock:
            return sum(1 for a in self._attempts.values() if a.worker == worker)

    def leased_unattempted_count(self, owner: str) -> int:
        """Items leased to `owner` with no attempt open, at one instant (one lock hold).

        What a crash of that worker strands until the leases run out.
        """
        with self._lock:
            attempting = {a.key for a in self._attempts.values() if a.finished_at is None}
            return sum(
                1
                for i in self._items.values()
                if i.state is DeliveryState.CLAIMED
                and i.lease_owner == owner
                and i.key not in attempting
            )

    @property
    def cleanups(self) -> list[CleanupRecord]:
        with self._lock:
            return list(self._cleanups)

    @property
    def archived_rows(self) -> list[ArchivedRow]:
        with self._lock:
            return list(self._archived)

    @property
    def transitions(self) -> list[Transition]:
        """Every transition applied (by `apply` or `complete`), in order; lost races excluded."""
        with self._lock:
            return list(self._transitions)

    def force_duplicate_cleanup_record(self, key: OperationKey) -> None:
        """Test-only: a second cleanup record for `key`, past the uniqueness guard."""
        with self._lock:
            first = next((c for c in self._cleanups if c.key == key), None)
            if first is None:
                raise LookupError(f"{key} has no cleanup record to duplicate")
            self._cleanups.append(replace(first, rows=0))

    def force_cleanup_record(self, key: OperationKey, at: datetime) -> None:
        """Test-only: a cleanup record for `key` whatever its state (e.g. one never sent)."""
        with self._lock:
            self._cleanups.append(CleanupRecord(key, key.period, CleanupMode.DELETE, 0, at, at))
