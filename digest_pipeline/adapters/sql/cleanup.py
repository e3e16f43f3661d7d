"""Cleanup: the unique cleanup row, the rows archived or deleted and `sent → cleaned`, atomically."""

from collections import Counter
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import (
    Connection,
    insert,
    literal,
    select,
)

from digest_pipeline.adapters.sql.base import KEYS, SqlBase, wi
from digest_pipeline.adapters.sql.bulk import insert_rows, update_many
from digest_pipeline.adapters.sql.clauses import locked_items, one_of
from digest_pipeline.adapters.sql.schema import (
    cleanups,
    digest_rows,
    digest_rows_archive,
)
from digest_pipeline.domain.chunks import chunked
from digest_pipeline.domain.errors import DigestError, LostRace, UnknownWorkItem
from digest_pipeline.domain.model import (
    CleanupMode,
    CleanupReceipt,
)
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.ports import Cleaner

#: `sent → cleaned` is guarded like every transition: on key, state and fencing token
_GUARD = ("operation_key", "state", "lease_token")
#: the columns it sets, each row's own value (one cached statement for every chunk)
_CLEANED = dict.fromkeys(("state", "cleaned_at", "updated_at"))


class SqlCleaner(SqlBase, Cleaner):
    """The `Cleaner` role of `SqlLedger`."""

    def clean_many(
        self, items: Sequence[tuple[OperationKey, int]], mode: CleanupMode, now: datetime
    ) -> list[CleanupReceipt | DigestError]:
        if not items:
            return []
        out: list[CleanupReceipt | DigestError] = []
        for chunk in chunked(items, KEYS):
            with self._engine.begin() as conn:
                out.extend(self._clean_chunk(conn, chunk, mode, now))
        return out

    def _clean_chunk(
        self,
        conn: Connection,
        items: Sequence[tuple[OperationKey, int]],
        mode: CleanupMode,
        now: datetime,
    ) -> list[CleanupReceipt | DigestError]:
        """One transaction: the unique cleanup rows, the rows removed and `sent → cleaned`.

        The items are read and locked first, so only those that are `sent` under the caller's
        token get a cleanup row; a key already cleaned keeps its first row and is reported.
        An item is `cleaned` exactly when its cleanup row exists (both are written here, in one
        transaction), so its state says so without a look at the cleanup rows, which a growing
        period's chunks each scanned whole. A cleanup row that exists anyway, beside an item
        still `sent` (a ledger edited by hand), fails the chunk on the table's unique key
        before anything of it commits.
        """
        by_text = {str(k): k for k, _ in items}
        keys = list(by_text)
        locked = locked_items(keys, self._pg, wi.c.operation_key, wi.c.state, wi.c.lease_token)
        current = {k: (state, token) for k, state, token in conn.execute(locked)}
        cleaned = {k for k, (state, _) in current.items() if state == DeliveryState.CLEANED.value}
        movable = [
            k
            for k, token in ((str(k), t) for k, t in items)
            if k not in cleaned and current.get(k) == (DeliveryState.SENT.value, token)
        ]
        rows: Counter[str] = Counter()
        if movable:
            # the rows go first: each cleanup row records how many its key had
            rows = self._remove_rows(conn, movable, mode, now)
            insert_rows(
                conn,
                cleanups,
                [
                    {
                        "operation_key": k,
                        "period": str(by_text[k].period),
                        "mode": mode.value,
                        "rows": rows[k],
                        "claimed_at": now,
                        "completed_at": now,
                    }
                    for k in movable
                ],
            )
            # The compare-and-set on key, state and token every transition makes, joined on
            # all three: a constant `state = 'sent'` let the planner, whose statistics still
            # saw every item `pending`, read the chunk through the state index (every sent item
            # of the ledger, for each chunk).
            values = {"state": DeliveryState.CLEANED.value, "cleaned_at": now, "updated_at": now}
            guarded = [((k, DeliveryState.SENT.value, current[k][1]), values) for k in movable]
            if update_many(conn, wi, _GUARD, _CLEANED, guarded) != len(guarded):
                # the rows are locked and their guards were just read: a bug, not a race
                raise RuntimeError(f"cleanup's guarded update missed some of {len(guarded)} rows")
        receipts: list[CleanupReceipt | DigestError] = []
        for key, token in items:
            k = str(key)
            if k in cleaned:
                receipts.append(CleanupReceipt(key, "already_cleaned", 0))
            elif k in current and current[k] == (DeliveryState.SENT.value, token):
                receipts.append(CleanupReceipt(key, "cleaned", rows[k]))
            elif k in current:
                state, held = current[k]
                receipts.append(
                    LostRace(
                        f"{key}: cleanup needs a sent item with token {token}; it is "
                        f"{state} with token {held}"
                    )
                )
            else:
                receipts.append(UnknownWorkItem(f"no work item for {key}"))
        return receipts

    def _remove_rows(
        self, conn: Connection, keys: Sequence[str], mode: CleanupMode, now: datetime
    ) -> Counter[str]:
        """Archives (or only deletes) the keys' digest rows; how many rows each key had."""
        dr = digest_rows
        chosen = one_of(dr.c.operation_key, keys, self._pg)
        gone = dr.delete().where(chosen).returning(dr.c.operation_key)
        if mode is CleanupMode.DELETE:
            return Counter(conn.execute(gone).scalars())
        names = ["row_id", "operation_key", "period", "customer_id", "position", "payload"]
        # bind `now` through the archive column's own type so it is stored as UTC
        stamp = literal(now, digest_rows_archive.c.archived_at.type)
        archive = insert(digest_rows_archive)
        if self._pg:
            # one pass over the rows: the DELETE hands each row it removes to the archive
            moved = dr.delete().where(chosen).returning(*[dr.c[n] for n in names]).cte("moved")
            source = select(*[moved.c[n] for n in names], stamp)
            stmt = archive.from_select([*names, "archived_at"], source)
            return Counter(
                conn.execute(stmt.returning(digest_rows_archive.c.operation_key)).scalars()
            )
        source = select(*[dr.c[n] for n in names], stamp).where(chosen)
        conn.execute(archive.from_select([*names, "archived_at"], source))
        return Counter(conn.execute(gone).scalars())
