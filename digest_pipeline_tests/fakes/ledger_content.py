"""The fake ledger's generated digest rows: written, read, and replaced only for never-sent items."""

from collections.abc import Iterable, Sequence

from digest_pipeline.domain.model import DigestRow
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.regeneration import REGENERABLE, RowReplacement
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.ports.ledger_roles import ContentStore
from digest_pipeline_tests.fakes.ledger_base import FakeLedgerBase


class FakeContent(FakeLedgerBase, ContentStore):
    """`ContentStore` in memory; a replacement checks every key's state under the one lock."""

    def add_digest_rows(self, rows: Iterable[DigestRow]) -> int:
        with self._lock:
            new = list(rows)
            for r in new:
                self._rows.setdefault(r.key, []).append(r)
            return len(new)

    def digest_rows_of(self, keys: Sequence[OperationKey]) -> dict[OperationKey, list[DigestRow]]:
        with self._lock:
            return {k: sorted(self._rows.get(k, []), key=lambda r: r.position) for k in keys}

    def keys_with_rows(self, period: Period) -> set[OperationKey]:
        with self._lock:
            return {r.key for rows in self._rows.values() for r in rows if r.key.period == period}

    def replace_digest_rows(
        self, keys: Sequence[OperationKey], rows: Iterable[DigestRow]
    ) -> RowReplacement:
        with self._lock:
            wanted = list(dict.fromkeys(keys))
            new = list(rows)
            strays = sorted({str(r.key) for r in new} - {str(k) for k in wanted})
            if strays:
                raise ValueError(f"rows of keys not being replaced: {', '.join(strays[:3])}")
            refused: dict[OperationKey, DeliveryState | None] = {}
            replaced: set[OperationKey] = set()
            for key in wanted:
                item = self._items.get(key)
                if item is not None and item.state in REGENERABLE:
                    replaced.add(key)
                else:
                    refused[key] = item.state if item is not None else None
            removed = sum(len(self._rows.pop(k, [])) for k in replaced)
            written = [r for r in new if r.key in replaced]
            for r in written:
                self._rows.setdefault(r.key, []).append(r)
            return RowReplacement(frozenset(replaced), refused, removed, len(written))
