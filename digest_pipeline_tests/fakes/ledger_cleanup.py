"""The fake ledger's cleanup: a sent item's rows archived or deleted once, with its cleanup record."""

from collections.abc import Sequence
from datetime import datetime

from digest_pipeline.domain import transitions
from digest_pipeline.domain.errors import DigestError
from digest_pipeline.domain.model import CleanupMode, CleanupReceipt
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.ports.ledger_roles import Cleaner
from digest_pipeline_tests.fakes.ledger_base import ArchivedRow, CleanupRecord, FakeLedgerBase


class FakeCleaner(FakeLedgerBase, Cleaner):
    """`Cleaner` in memory: the cleanup record is unique per key, the move `sent → cleaned` guarded."""

    def clean_many(
        self, items: Sequence[tuple[OperationKey, int]], mode: CleanupMode, now: datetime
    ) -> list[CleanupReceipt | DigestError]:
        receipts: list[CleanupReceipt | DigestError] = []
        with self._lock:
            for key, token in items:
                try:
                    receipts.append(self._clean_locked(key, token, mode, now))
                except DigestError as e:
                    receipts.append(e)
        return receipts

    def _clean_locked(
        self, key: OperationKey, token: int, mode: CleanupMode, now: datetime
    ) -> CleanupReceipt:
        item = self._require_locked(key)
        if any(c.key == key for c in self._cleanups):
            return CleanupReceipt(key, "already_cleaned", 0)
        done = transitions.cleaned(item, token, now)
        rows = self._rows.pop(key, [])
        if mode is CleanupMode.ARCHIVE:
            self._archived.extend(ArchivedRow(r, now) for r in rows)
        self._cleanups.append(CleanupRecord(key, key.period, mode, len(rows), now, now))
        self._items[key] = done
        return CleanupReceipt(key, "cleaned", len(rows))
