"""The frozen eligibility selection: frozen once per period, read page by page."""

from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    select,
    tuple_,
    update,
)
from sqlalchemy.exc import IntegrityError

from digest_pipeline.adapters.sql.base import CHUNK, KEYS, SqlBase
from digest_pipeline.adapters.sql.bulk import insert_rows
from digest_pipeline.adapters.sql.clauses import one_of
from digest_pipeline.adapters.sql.demo_marker import holds_demo_data
from digest_pipeline.adapters.sql.schema import (
    eligibility_snapshot,
    period_runs,
    suppressions,
)
from digest_pipeline.domain.chunks import chunked
from digest_pipeline.domain.model import (
    SnapshotEntry,
    SnapshotInfo,
    SnapshotReceipt,
    fingerprint_entry,
    format_fingerprint,
)
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.ports import SnapshotStore


class SqlSnapshots(SqlBase, SnapshotStore):
    """The `SnapshotStore` role of `SqlLedger`."""

    def freeze_snapshot(
        self, period: Period, run_id: str, selected_at: datetime, entries: Iterable[SnapshotEntry]
    ) -> SnapshotReceipt:
        p = str(period)
        with self._engine.begin() as conn:
            claimed = conn.execute(
                self._insert(period_runs)
                .values(
                    period=p,
                    selection_run_id=run_id,
                    selected_at=selected_at,
                    eligible_count=0,
                    fingerprint="",
                )
                .on_conflict_do_nothing(index_elements=["period"])
                .returning(period_runs.c.period)
            ).first()
            if claimed is None:
                existing = self._snapshot_info(conn, period)
                assert existing is not None
                return SnapshotReceipt(existing, reused=True)
            count, total = 0, 0

            def rows() -> Iterator[dict[str, Any]]:
                nonlocal count, total
                for e in entries:
                    count += 1
                    total += fingerprint_entry(e)
                    yield {"period": p, "customer_id": e.customer_id, "recipient": e.recipient}

            try:
                for chunk in chunked(rows(), CHUNK):
                    insert_rows(conn, eligibility_snapshot, chunk)
            except IntegrityError as e:
                raise ValueError(f"duplicate customer id in the snapshot of {period}") from e
            conn.execute(
                update(period_runs)
                .where(period_runs.c.period == p)
                .values(eligible_count=count, fingerprint=format_fingerprint(total))
            )
            info = self._snapshot_info(conn, period)
        assert info is not None
        # delivery looks every claim's recipient up by customer id
        self._refresh_statistics([eligibility_snapshot], count)
        return SnapshotReceipt(info, reused=False)

    def snapshot(self, period: Period) -> SnapshotInfo | None:
        with self._engine.connect() as conn:
            return self._snapshot_info(conn, period)

    def snapshot_entries(self, period: Period) -> list[SnapshotEntry]:
        es = eligibility_snapshot
        q = select(es.c.customer_id, es.c.recipient).where(es.c.period == str(period))
        with self._engine.connect() as conn:
            entries = [SnapshotEntry(r.customer_id, r.recipient) for r in conn.execute(q)]
        return sorted(entries, key=lambda e: e.customer_id)

    def iter_snapshot_entries(self, period: Period, page: int = 1_000) -> Iterator[SnapshotEntry]:
        es = eligibility_snapshot
        q = select(es.c.customer_id, es.c.recipient).where(es.c.period == str(period))
        yield from self._pages(
            q, es.c.customer_id, lambda r: SnapshotEntry(r["customer_id"], r["recipient"]), page
        )

    def holds_demo_data(self) -> bool:
        return holds_demo_data(self._engine)

    def suppressed_ids(self) -> frozenset[str]:
        with self._engine.connect() as conn:
            return frozenset(conn.execute(select(suppressions.c.customer_id)).scalars())

    def recipients(self, keys: Sequence[OperationKey]) -> dict[OperationKey, str]:
        es = eligibility_snapshot
        by_customer: dict[tuple[str, str], OperationKey] = {
            (str(k.period), k.customer_id): k for k in keys
        }
        found: dict[OperationKey, str] = {}
        with self._engine.connect() as conn:
            if self._pg:
                # one array of customer ids a period (a claim's keys are nearly always one week)
                periods: dict[str, list[str]] = {}
                for period, customer_id in by_customer:
                    periods.setdefault(period, []).append(customer_id)
                for period, ids in periods.items():
                    for part in chunked(ids, CHUNK):
                        lookup = select(es.c.customer_id, es.c.recipient).where(
                            es.c.period == period, one_of(es.c.customer_id, part, True)
                        )
                        rows = conn.execute(lookup)
                        found.update((by_customer[(period, c)], r) for c, r in rows)
                return found
            for chunk in chunked(by_customer, KEYS):
                q = select(es.c.period, es.c.customer_id, es.c.recipient).where(
                    # plain INs first: an index search on SQLite, which scans for row values
                    es.c.period.in_({p for p, _ in chunk}),
                    es.c.customer_id.in_([c for _, c in chunk]),
                    tuple_(es.c.period, es.c.customer_id).in_(chunk),
                )
                found.update((by_customer[(p, c)], r) for p, c, r in conn.execute(q))
        return found
