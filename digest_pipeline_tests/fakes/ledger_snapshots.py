"""The fake ledger's frozen eligibility snapshots: frozen once per period, then only read."""

from collections.abc import Iterable, Sequence
from datetime import datetime

from digest_pipeline.domain.model import (
    SnapshotEntry,
    SnapshotInfo,
    SnapshotReceipt,
    snapshot_fingerprint,
)
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.ports.ledger_roles import SnapshotStore
from digest_pipeline_tests.fakes.ledger_base import FakeLedgerBase


class FakeSnapshots(FakeLedgerBase, SnapshotStore):
    """`SnapshotStore` in memory, plus a hook that tampers with a frozen entry."""

    def freeze_snapshot(
        self, period: Period, run_id: str, selected_at: datetime, entries: Iterable[SnapshotEntry]
    ) -> SnapshotReceipt:
        with self._lock:
            existing = self._snapshots.get(period)
            if existing is not None:
                return SnapshotReceipt(existing, reused=True)
            selected = list(entries)
            by_id: dict[str, SnapshotEntry] = {}
            for e in selected:
                if e.customer_id in by_id:
                    raise ValueError(f"duplicate customer id {e.customer_id} in snapshot")
                by_id[e.customer_id] = e
            info = SnapshotInfo(
                period=period,
                selection_run_id=run_id,
                selected_at=selected_at,
                eligible_count=len(selected),
                fingerprint=snapshot_fingerprint(selected),
                enqueued_at=None,
            )
            self._snapshots[period] = info
            self._entries[period] = by_id
            return SnapshotReceipt(info, reused=False)

    def snapshot(self, period: Period) -> SnapshotInfo | None:
        with self._lock:
            return self._snapshots.get(period)

    def snapshot_entries(self, period: Period) -> list[SnapshotEntry]:
        with self._lock:
            return self._sorted_entries_locked(period)

    def recipients(self, keys: Sequence[OperationKey]) -> dict[OperationKey, str]:
        with self._lock:
            found = {k: self._entries.get(k.period, {}).get(k.customer_id) for k in keys}
            return {k: e.recipient for k, e in found.items() if e is not None}

    def holds_demo_data(self) -> bool:
        return self.demo_data

    def suppressed_ids(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._suppressions)

    def tamper_snapshot(self, period: Period, customer_id: str, recipient: str) -> None:
        """Test-only: changes a frozen entry's recipient, as a bad migration or hand edit would."""
        with self._lock:
            entries = self._entries[period]
            if customer_id not in entries:
                raise LookupError(f"{customer_id} is not in the snapshot of {period}")
            entries[customer_id] = SnapshotEntry(customer_id, recipient)
