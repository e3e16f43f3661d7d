"""The suppression list in SQL, and the cancelling of a suppressed customer's unsent items.

It extends the work queue because a suppression and its cancellations are one transaction: the
row goes in with `INSERT … ON CONFLICT DO NOTHING` (concurrent requests for one customer record
it once) and the customer's items whose attempt has not started move to `suppressed` through the
queue's guarded moves, with their audit rows, before it commits. The guarded update that starts
attempts checks the list too, and the claims it refuses for it end `suppressed` here, in its
transaction; so no attempt starts after a suppression has committed: whichever of the two locks
an item first, the other sees what it did (on PostgreSQL the suppression waits for a start in
progress, then reads its attempt in a statement of its own).
"""

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, delete, select, tuple_

from digest_pipeline.adapters.sql.base import KEYS, wi
from digest_pipeline.adapters.sql.clauses import one_of
from digest_pipeline.adapters.sql.queue import SqlWorkQueue
from digest_pipeline.adapters.sql.rows import work_item
from digest_pipeline.adapters.sql.schema import attempts, suppressions
from digest_pipeline.domain.chunks import chunked
from digest_pipeline.domain.feedback import (
    SOURCE_LENGTH,
    Suppression,
    SuppressionReason,
    suppression_audit,
    unsuppression_audit,
)
from digest_pipeline.domain.model import Claim
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.states import CLAIMABLE, DeliveryState
from digest_pipeline.domain.transitions import cancelled_by_suppression, suppressible
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

    def _end_suppressed_claims(
        self, conn: Connection, claims: Sequence[Claim], now: datetime
    ) -> None:
        held = [(str(c.key), c.token) for c in claims]
        rows: list[Any] = []
        for chunk in chunked(held, KEYS):
            q = (
                select(wi, sp.c.reason)
                .join(sp, sp.c.customer_id == wi.c.customer_id)
                .where(
                    one_of(wi.c.operation_key, [k for k, _ in chunk], self._pg),
                    tuple_(wi.c.operation_key, wi.c.lease_token).in_(chunk),
                    wi.c.state == DeliveryState.CLAIMED.value,
                )
                .order_by(wi.c.operation_key)
                .with_for_update(of=wi)
            )
            rows += conn.execute(q).mappings().all()
        if rows:
            moves = [cancelled_by_suppression(work_item(r), now, r["reason"]) for r in rows]
            if lost := self._apply_many(conn, moves):
                # locked rows cannot lose their guard: a lost one is a bug
                raise next(iter(lost.values()))

    def _cancel(
        self,
        conn: Connection,
        now: datetime,
        *,
        period: Period | None = None,
        customer_id: str | None = None,
    ) -> list[OperationKey]:
        """Moves the matching items of suppressed customers whose attempt has not started.

        For one customer (a suppression being recorded) their claims too, waiting for a start
        in progress; for a period's sweep only the unclaimed ones, skipping any a worker has
        locked (its attempt's start checks the list itself).
        """
        q = select(wi, sp.c.reason).join(sp, sp.c.customer_id == wi.c.customer_id)
        if period is not None:
            q = q.where(wi.c.period == str(period))
        if customer_id is None:
            q = q.where(wi.c.state.in_([s.value for s in CLAIMABLE]))
            # locked, so no worker claims one between this read and the move
            rows = conn.execute(q.with_for_update(of=wi, skip_locked=True)).mappings().all()
            started: set[tuple[str, int]] = set()
        else:
            states = [s.value for s in (*CLAIMABLE, DeliveryState.CLAIMED)]
            q = q.where(wi.c.customer_id == customer_id, wi.c.state.in_(states))
            locked = q.order_by(wi.c.operation_key).with_for_update(of=wi)
            rows = conn.execute(locked).mappings().all()
            # a statement of its own: it sees an attempt whose start committed while this
            # transaction waited for the item's lock
            keys = [r["operation_key"] for r in rows]
            q_started = select(attempts.c.operation_key, attempts.c.lease_token).where(
                attempts.c.operation_key.in_(keys)
            )
            started = {(k, token) for k, token in conn.execute(q_started)}
        moves = []
        for r in rows:
            item, begun = work_item(r), (r["operation_key"], r["lease_token"]) in started
            if suppressible(item, begun):
                moves.append(cancelled_by_suppression(item, now, r["reason"], begun))
        if moves and (lost := self._apply_many(conn, moves)):
            # locked rows cannot lose their guard: a lost one is a bug
            raise next(iter(lost.values()))
        return sorted((t.key for t in moves), key=str)
