"""The work queue: enqueue, and claim with fencing tokens.

`SqlWorkQueue` composes them with the start of attempts (`starts`), the guarded moves and
completions (`moves`) and lease recovery (`leases`), as `SqlLedger` composes its roles.
"""

from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import cast, func, literal, select, update
from sqlalchemy.dialects import postgresql

from digest_pipeline.adapters.sql import rows as sql_rows
from digest_pipeline.adapters.sql.base import ANALYZE_AFTER, sqlite_statistics_outgrown, wi
from digest_pipeline.adapters.sql.clauses import due_clause
from digest_pipeline.adapters.sql.leases import SqlLeaseRecovery
from digest_pipeline.adapters.sql.schema import eligibility_snapshot, period_runs
from digest_pipeline.adapters.sql.starts import SqlAttemptStarts
from digest_pipeline.domain.errors import DigestError, SnapshotMissing
from digest_pipeline.domain.failures import SendOutcome
from digest_pipeline.domain.model import AttemptTicket, Claim, EnqueueReceipt, Transition
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.states import DeliveryState, check_transition
from digest_pipeline.ports import WorkQueue


class SqlWorkQueue(SqlLeaseRecovery, SqlAttemptStarts, WorkQueue):
    """The `WorkQueue` role of `SqlLedger`."""

    def enqueue(self, period: Period, now: datetime) -> EnqueueReceipt:
        es, p = eligibility_snapshot, str(period)
        with self._engine.begin() as conn:
            info = self._snapshot_info(conn, period)
            if info is None:
                raise SnapshotMissing(f"period {period} has no frozen eligibility snapshot")
            source = select(
                literal(self._key_prefix(period)) + es.c.customer_id,
                es.c.period,
                es.c.customer_id,
                literal(DeliveryState.PENDING.value),
                literal(0),
                literal(0),
                literal(0),
                literal(now, wi.c.created_at.type),
                literal(now, wi.c.updated_at.type),
                literal(now, wi.c.next_attempt_at.type),
            ).where(es.c.period == p)
            columns = [
                "operation_key",
                "period",
                "customer_id",
                "state",
                "attempts",
                "budget_used",
                "lease_token",
                "created_at",
                "updated_at",
                "next_attempt_at",
            ]
            stmt = self._insert(wi).from_select(columns, source).on_conflict_do_nothing()
            # Drivers disagree on rowcount for INSERT … SELECT … ON CONFLICT; count instead.
            count = select(func.count()).select_from(wi).where(wi.c.period == p)
            before = conn.execute(count).scalar_one()
            conn.execute(stmt)
            created = conn.execute(count).scalar_one() - before
            conn.execute(
                update(period_runs)
                .where(period_runs.c.period == p, period_runs.c.enqueued_at.is_(None))
                .values(enqueued_at=now)
            )
            if created >= ANALYZE_AFTER and (self._pg or sqlite_statistics_outgrown(conn, wi)):
                # Fresh statistics before the first claim: with the planner still believing the
                # table is small, or this week's period unseen, it sorts the whole period
                # instead of reading the due index. PostgreSQL samples a bounded number of rows,
                # cheap at any size; SQLite reads them all, so only a grown table's.
                conn.exec_driver_sql("ANALYZE work_items")
        return EnqueueReceipt(created=created, existing=info.eligible_count - created)

    def due_count(self, now: datetime, period: Period | None = None) -> int:
        q = select(func.count()).select_from(wi).where(due_clause(now, period))
        with self._engine.connect() as conn:
            return int(conn.execute(q).scalar_one())

    def claim_due(
        self,
        now: datetime,
        owner: str,
        lease: timedelta,
        limit: int,
        period: Period | None = None,
    ) -> list[Claim]:
        if limit <= 0:
            return []
        due = due_clause(now, period)
        candidates = (
            select(wi.c.operation_key)
            .where(due)
            .order_by(wi.c.next_attempt_at, wi.c.operation_key)
            .limit(limit)
            .with_for_update(skip_locked=True)
            .cte("due")
        )
        expires = now + lease
        if self._pg:
            # Each chosen key found through the primary key: joined to the CTE, the planner
            # walks the whole key index past every item already sent (its statistics, read
            # before the run, count nothing claimed or sent), a claim slower the further the
            # period gets. The cast makes `ANY` take the one array, not the subquery's rows.
            #
            # Only the key: the CTE's rows are locked (FOR UPDATE re-checks `due` on the latest
            # version of each), so nothing can have moved them out of `due` since. Checked again
            # here, `due` lets a planner that thinks the period nearly empty (a new week the
            # statistics have not seen yet) read the due index instead and test each row's key
            # against the whole array, a slow claim.
            keys = select(func.array_agg(candidates.c.operation_key)).scalar_subquery()
            chosen = [
                wi.c.operation_key
                == func.any(cast(keys, postgresql.ARRAY(wi.c.operation_key.type)))
            ]
        else:
            chosen = [wi.c.operation_key == candidates.c.operation_key, due]
        stmt = (
            update(wi)
            .where(*chosen)
            .values(
                state=DeliveryState.CLAIMED.value,
                lease_owner=owner,
                lease_token=wi.c.lease_token + 1,
                lease_expires_at=expires,
                first_claimed_at=func.coalesce(wi.c.first_claimed_at, now),
                next_attempt_at=None,
                updated_at=now,
            )
            .returning(*wi.c)
        )
        with self._engine.begin() as conn:
            rows = conn.execute(stmt).mappings().all()
        ordered = sorted(rows, key=lambda r: r["operation_key"])
        return [Claim(i, i.lease_token, owner, expires) for i in map(sql_rows.work_item, ordered)]

    def record_and_start(
        self,
        results: Sequence[tuple[AttemptTicket, SendOutcome, Transition]],
        claims: Sequence[Claim],
        now: datetime,
        *,
        mailer: str,
    ) -> tuple[list[DigestError | None], list[AttemptTicket | DigestError]]:
        for _, _, t in results:
            check_transition(t.expected, t.target)
        if not results and not claims:
            return [], []
        with self._engine.begin() as conn:
            errors = self._complete(conn, results) if results else []
            tickets = self._start(conn, claims, now, mailer) if claims else []
        return errors, tickets
