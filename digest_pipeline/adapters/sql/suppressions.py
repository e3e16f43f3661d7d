"""The suppression list in SQL, and the cancelling of a suppressed customer's unclaimed items.

It extends the work queue because a suppression and its cancellations are one transaction: the
row goes in with `INSERT … ON CONFLICT DO NOTHING` (concurrent requests for one customer record
it once) and the customer's never-claimed items move to `suppressed` through the queue's guarded
moves, with their audit rows, before it commits.
"""

from datetime import datetime

from sqlalchemy import Connection, delete, select

from digest_pipeline.adapters.sql.base import wi
from digest_pipeline.adapters.sql.queue import SqlWorkQueue
from digest_pipeline.adapters.sql.rows import work_item
from digest_pipeline.adapters.sql.schema import suppressions
from digest_pipeline.domain.feedback import (
    SOURCE_LENGTH,
    Suppression,
    SuppressionReason,
    suppression_audit,
    unsuppression_audit,
)
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.states import CLAIMABLE
from digest_pipeline.domain.transitions import cancelled_by_suppression
from digest_pipeline.ports import SuppressionList

sp = suppressions


class SqlSuppressions(SqlWorkQueue, SuppressionList):
    """The `SuppressionList` role of `SqlLedger`, with `WorkQueue.cancel_suppressed`."""

    def suppress(self, suppression: Suppression, note: str = "") -> bool:
        row = {
            "customer_id": suppression.customer_id,
            "reason": suppression.reason.value,
            "source": suppression.source[:SOURCE_LENGTH],
            "created_at": suppression.created_at,
        }
        # RETURNING, not rowcount: psycopg reports -1 for an INSERT … ON CONFLICT DO NOTHING
        stmt = self._insert(sp).values(row).on_conflict_do_nothing().returning(sp.c.customer_id)
        with self._engine.begin() as conn:
            if conn.execute(stmt).first() is None:
                return False
            self._insert_audit(conn, suppression_audit(suppression, note))
            self._cancel(conn, suppression.created_at, customer_id=suppression.customer_id)
        return True

    def unsuppress(self, customer_id: str, at: datetime, actor: str, reason: str) -> bool:
        with self._engine.begin() as conn:
            gone = conn.execute(
                delete(sp).where(sp.c.customer_id == customer_id).returning(sp.c.customer_id)
            ).first()
            if gone is None:
                return False
            self._insert_audit(conn, unsuppression_audit(customer_id, at, actor, reason))
        return True

    def suppressions(self) -> list[Suppression]:
        with self._engine.connect() as conn:
            rows = conn.execute(select(sp).order_by(sp.c.customer_id))
            return [
                Suppression(r.customer_id, SuppressionReason(r.reason), r.source, r.created_at)
                for r in rows
            ]

    def cancel_suppressed(self, now: datetime, period: Period | None = None) -> list[OperationKey]:
        with self._engine.begin() as conn:
            return self._cancel(conn, now, period=period)

    def _cancel(
        self,
        conn: Connection,
        now: datetime,
        *,
        period: Period | None = None,
        customer_id: str | None = None,
    ) -> list[OperationKey]:
        """Moves the matching never-claimed items of suppressed customers to `suppressed`."""
        q = select(wi, sp.c.reason).join(sp, sp.c.customer_id == wi.c.customer_id)
        q = q.where(wi.c.state.in_([s.value for s in CLAIMABLE]))
        if period is not None:
            q = q.where(wi.c.period == str(period))
        if customer_id is not None:
            q = q.where(wi.c.customer_id == customer_id)
        # locked, so no worker claims one between this read and the move
        rows = conn.execute(q.with_for_update(of=wi, skip_locked=True)).mappings().all()
        moves = [cancelled_by_suppression(work_item(r), now, r["reason"]) for r in rows]
        if moves and (lost := self._apply_many(conn, moves)):
            # locked rows cannot lose their guard: a lost one is a bug
            raise next(iter(lost.values()))
        return sorted((t.key for t in moves), key=str)
