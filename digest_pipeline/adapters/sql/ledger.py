"""The SQL ledger: the source of truth for work items, on SQLite or PostgreSQL (SQLAlchemy Core).

Every state change is one guarded `UPDATE … WHERE operation_key = :k AND state = :expected AND
lease_token = :token`; zero rows raise LostRace. Claims use `FOR UPDATE SKIP LOCKED` on
PostgreSQL and a serialized `BEGIN IMMEDIATE` transaction on SQLite.
"""

from collections.abc import Collection, Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Select,
    and_,
    bindparam,
    exists,
    func,
    insert,
    literal,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError

from digest_pipeline.adapters.sql import rows as sql_rows
from digest_pipeline.adapters.sql.invariants import evaluate_invariants
from digest_pipeline.adapters.sql.schema import (
    CLAIMABLE_SQL,
    attempts,
    audit_log,
    cleanups,
    dead_letters,
    digest_rows,
    digest_rows_archive,
    eligibility_snapshot,
    period_runs,
    work_items,
)
from digest_pipeline.domain.chunks import chunked
from digest_pipeline.domain.errors import DigestError, LostRace, SnapshotMissing, UnknownWorkItem
from digest_pipeline.domain.failures import SendOutcome
from digest_pipeline.domain.model import (
    Attempt,
    AttemptTicket,
    AuditEntry,
    Claim,
    CleanupMode,
    CleanupReceipt,
    ClearDedupe,
    DeadLetterRecord,
    DigestRow,
    EnqueueReceipt,
    InvariantResult,
    LeaseRecovery,
    RefundBudget,
    Reopen,
    SnapshotEntry,
    SnapshotInfo,
    SnapshotReceipt,
    Transition,
    WorkItem,
    fingerprint_entry,
    format_fingerprint,
)
from digest_pipeline.domain.periods import KEY_PREFIX, OperationKey, Period
from digest_pipeline.domain.regeneration import REGENERABLE, RowReplacement
from digest_pipeline.domain.states import TERMINAL, DeliveryState, check_transition
from digest_pipeline.domain.transitions import DETAIL_LENGTH, after_lease_expiry
from digest_pipeline.ports import Ledger

CHUNK = 5_000
#: an enqueue that creates this many items refreshes the table's planner statistics
ANALYZE_AFTER = 1_000
#: keys per `IN (…)` list: far below every driver's bound-parameter limit
KEYS = 500
#: marks a key already moved earlier in the same batch
_MOVED: Any = object()
wi = work_items
#: a throttled attempt gives its budget unit back (one shared expression, so transitions that
#: refund group into one statement)
REFUND = wi.c.budget_used - 1


def _due(now: datetime, period: Period | None) -> ColumnElement[bool]:
    due = and_(text(f"work_items.{CLAIMABLE_SQL}"), wi.c.next_attempt_at <= now)
    return due if period is None else and_(due, wi.c.period == str(period))


def _period_items(period: Period, states: Iterable[DeliveryState] | None) -> Select[Any]:
    q = select(wi).where(wi.c.period == str(period))
    return q if states is None else q.where(wi.c.state.in_([s.value for s in states]))


def _update_values(t: Transition) -> dict[str, Any]:
    """The columns a transition sets on its work item."""
    values: dict[str, Any] = {
        "state": t.target.value,
        "next_attempt_at": t.next_attempt_at,
        "updated_at": t.at,
    }
    if t.target is not DeliveryState.CLAIMED:
        values |= {"lease_owner": None, "lease_expires_at": None}
    if t.failure_class is not None:
        values["last_failure_class"] = t.failure_class.value
    if t.detail is not None:
        values["last_detail"] = t.detail[:DETAIL_LENGTH]
    if t.provider_message_id is not None:
        values["provider_message_id"] = t.provider_message_id
    if t.target is DeliveryState.SENT:
        values["sent_at"] = t.at
    if t.has(RefundBudget):
        values["budget_used"] = REFUND
    if t.resend_until is not None:
        values["dedupe_until"] = t.resend_until
    if t.has(Reopen):
        values |= {"budget_used": 0, "window_started_at": None, "replayed_at": t.at}
    if t.has(Reopen) or t.has(ClearDedupe):
        values["dedupe_until"] = None
    return values


def _audit_row(e: AuditEntry) -> dict[str, Any]:
    period = e.period or (e.key.period if e.key else None)
    return {
        "at": e.at,
        "actor": e.actor,
        "action": e.action,
        "period": str(period) if period else None,
        "operation_key": str(e.key) if e.key else None,
        "from_state": e.from_state.value if e.from_state else None,
        "to_state": e.to_state.value if e.to_state else None,
        "reason": e.reason,
    }


class SqlLedger(Ledger):
    """The `Ledger` port over an SQLAlchemy engine (schema from `engine.migrate`)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._pg = engine.dialect.name == "postgresql"

    @property
    def engine(self) -> Engine:
        return self._engine

    def _insert(self, table: Any) -> postgresql.Insert | sqlite.Insert:
        return postgresql.insert(table) if self._pg else sqlite.insert(table)

    # -- eligibility -----------------------------------------------------------------------
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
                    conn.execute(insert(eligibility_snapshot), chunk)
            except IntegrityError as e:
                raise ValueError(f"duplicate customer id in the snapshot of {period}") from e
            conn.execute(
                update(period_runs)
                .where(period_runs.c.period == p)
                .values(eligible_count=count, fingerprint=format_fingerprint(total))
            )
            info = self._snapshot_info(conn, period)
        assert info is not None
        return SnapshotReceipt(info, reused=False)

    def _snapshot_info(self, conn: Connection, period: Period) -> SnapshotInfo | None:
        r = (
            conn.execute(select(period_runs).where(period_runs.c.period == str(period)))
            .mappings()
            .first()
        )
        if r is None:
            return None
        return SnapshotInfo(
            period=period,
            selection_run_id=r["selection_run_id"],
            selected_at=r["selected_at"],
            eligible_count=r["eligible_count"],
            fingerprint=r["fingerprint"],
            enqueued_at=r["enqueued_at"],
        )

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
        after: str | None = None
        while True:
            # keyset pagination on the primary key: each page is its own short read
            paged = q if after is None else q.where(es.c.customer_id > after)
            with self._engine.connect() as conn:
                rows = conn.execute(paged.order_by(es.c.customer_id).limit(page))
                entries = [SnapshotEntry(r.customer_id, r.recipient) for r in rows]
            yield from entries
            if len(entries) < page:
                return
            after = entries[-1].customer_id

    def recipient(self, key: OperationKey) -> str | None:
        return self.recipients([key]).get(key)

    def recipients(self, keys: Sequence[OperationKey]) -> dict[OperationKey, str]:
        es = eligibility_snapshot
        by_customer: dict[tuple[str, str], OperationKey] = {
            (str(k.period), k.customer_id): k for k in keys
        }
        found: dict[OperationKey, str] = {}
        with self._engine.connect() as conn:
            for chunk in chunked(by_customer, KEYS):
                q = select(es.c.period, es.c.customer_id, es.c.recipient).where(
                    # plain INs first: an index search on SQLite, which scans for row values
                    es.c.period.in_({p for p, _ in chunk}),
                    es.c.customer_id.in_([c for _, c in chunk]),
                    tuple_(es.c.period, es.c.customer_id).in_(chunk),
                )
                found.update((by_customer[(p, c)], r) for p, c, r in conn.execute(q))
        return found

    # -- generated content -----------------------------------------------------------------
    def add_digest_rows(self, rows: Iterable[DigestRow]) -> int:
        written = 0
        values = (
            {
                "operation_key": str(r.key),
                "period": str(r.key.period),
                "customer_id": r.key.customer_id,
                "position": r.position,
                "payload": r.payload,
            }
            for r in rows
        )
        with self._engine.begin() as conn:
            for chunk in chunked(values, CHUNK):
                conn.execute(insert(digest_rows), chunk)
                written += len(chunk)
        return written

    def digest_rows(self, key: OperationKey) -> list[DigestRow]:
        return self.digest_rows_of([key])[key]

    def digest_rows_of(self, keys: Sequence[OperationKey]) -> dict[OperationKey, list[DigestRow]]:
        found: dict[OperationKey, list[DigestRow]] = {k: [] for k in keys}
        by_name = {str(k): k for k in keys}
        dr = digest_rows
        with self._engine.connect() as conn:
            for chunk in chunked(by_name, KEYS):
                q = (
                    select(dr.c.operation_key, dr.c.position, dr.c.payload)
                    .where(dr.c.operation_key.in_(chunk))
                    .order_by(dr.c.operation_key, dr.c.position, dr.c.row_id)
                )
                for name, position, payload in conn.execute(q):
                    key = by_name[name]
                    found[key].append(DigestRow(key, position, payload))
        return found

    def keys_with_rows_of(self, keys: Sequence[OperationKey]) -> set[OperationKey]:
        by_name = {str(k): k for k in keys}
        found: set[OperationKey] = set()
        dr = digest_rows
        with self._engine.connect() as conn:
            for chunk in chunked(by_name, KEYS):
                q = select(dr.c.operation_key).where(dr.c.operation_key.in_(chunk)).distinct()
                found.update(by_name[name] for name in conn.execute(q).scalars())
        return found

    def keys_with_rows(self, period: Period) -> set[OperationKey]:
        q = (
            select(digest_rows.c.operation_key)
            .where(digest_rows.c.period == str(period))
            .distinct()
        )
        with self._engine.connect() as conn:
            return {OperationKey.parse(k) for k in conn.execute(q).scalars()}

    # -- work items ------------------------------------------------------------------------
    def enqueue(self, period: Period, now: datetime) -> EnqueueReceipt:
        es, p = eligibility_snapshot, str(period)
        with self._engine.begin() as conn:
            info = self._snapshot_info(conn, period)
            if info is None:
                raise SnapshotMissing(f"period {period} has no frozen eligibility snapshot")
            source = select(
                literal(f"{KEY_PREFIX}:{p}:") + es.c.customer_id,
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
            if created >= ANALYZE_AFTER:
                # Fresh statistics before the first claim: with the planner still believing the
                # table is small, it sorts the whole period instead of reading the due index.
                conn.exec_driver_sql("ANALYZE work_items")
        return EnqueueReceipt(created=created, existing=info.eligible_count - created)

    def due_count(self, now: datetime, period: Period | None = None) -> int:
        q = select(func.count()).select_from(wi).where(_due(now, period))
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
        due = _due(now, period)
        candidates = (
            select(wi.c.operation_key)
            .where(due)
            .order_by(wi.c.next_attempt_at, wi.c.operation_key)
            .limit(limit)
            .with_for_update(skip_locked=True)
            .cte("due")
        )
        expires = now + lease
        stmt = (
            update(wi)
            .where(wi.c.operation_key == candidates.c.operation_key, due)
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
        items = sorted((sql_rows.work_item(r) for r in rows), key=lambda i: str(i.key))
        return [Claim(i, i.lease_token, owner, expires) for i in items]

    def start_attempt(self, claim: Claim, now: datetime) -> AttemptTicket:
        [started] = self.start_attempts([claim], now)
        if isinstance(started, DigestError):
            raise started
        return started

    def start_attempts(
        self, claims: Sequence[Claim], now: datetime
    ) -> list[AttemptTicket | DigestError]:
        if not claims:
            return []
        numbers: dict[str, int] = {}
        ids: dict[str, int] = {}
        with self._engine.begin() as conn:
            for chunk in chunked(claims, KEYS):
                guard = [(str(c.key), c.token) for c in chunk]
                numbers.update(
                    conn.execute(
                        update(wi)
                        .where(
                            # the plain IN gives SQLite an index to use; it scans for row values
                            wi.c.operation_key.in_([k for k, _ in guard]),
                            tuple_(wi.c.operation_key, wi.c.lease_token).in_(guard),
                            wi.c.state == DeliveryState.CLAIMED.value,
                            wi.c.lease_expires_at > now,
                        )
                        .values(
                            attempts=wi.c.attempts + 1,
                            budget_used=wi.c.budget_used + 1,
                            first_attempt_at=func.coalesce(wi.c.first_attempt_at, now),
                            window_started_at=func.coalesce(wi.c.window_started_at, now),
                            last_attempt_at=now,
                            updated_at=now,
                        )
                        .returning(wi.c.operation_key, wi.c.attempts)
                    ).all()
                )
            rows = [
                {
                    "operation_key": str(c.key),
                    "number": numbers[str(c.key)],
                    "lease_token": c.token,
                    "worker": c.owner,
                    "started_at": now,
                    "duplicate": False,
                }
                for c in claims
                if str(c.key) in numbers
            ]
            if rows:
                ids.update(
                    conn.execute(
                        insert(attempts).returning(
                            attempts.c.operation_key,
                            attempts.c.attempt_id,
                            sort_by_parameter_order=True,
                        ),
                        rows,
                    ).all()
                )
            missing = self._missing_or_lost(
                conn,
                [c.key for c in claims if str(c.key) not in numbers],
                "lease lost before the attempt started",
            )
        return [
            AttemptTicket(ids[k], c.key, numbers[k], c.token, now)
            if (k := str(c.key)) in numbers
            else missing[k]
            for c in claims
        ]

    def complete(self, ticket: AttemptTicket, outcome: SendOutcome, transition: Transition) -> None:
        [lost] = self.complete_many([(ticket, outcome, transition)])
        if lost is not None:
            raise lost

    def complete_many(
        self, results: Sequence[tuple[AttemptTicket, SendOutcome, Transition]]
    ) -> list[DigestError | None]:
        if not results:
            return []
        for _, _, t in results:
            check_transition(t.expected, t.target)
        closing = [
            {
                "b_attempt_id": ticket.attempt_id,
                "b_finished_at": t.at,
                "b_outcome": outcome.label,
                "b_detail": outcome.detail[:200],
                "b_provider_message_id": outcome.provider_message_id,
                "b_duplicate": outcome.duplicate,
            }
            for ticket, outcome, t in results
        ]
        with self._engine.begin() as conn:
            # Close every attempt, even one whose transition loses: it is evidence for
            # reconciliation, and it commits with the transitions that did apply.
            conn.execute(
                update(attempts)
                .where(
                    attempts.c.attempt_id == bindparam("b_attempt_id"),
                    attempts.c.finished_at.is_(None),
                )
                .values(
                    finished_at=bindparam("b_finished_at"),
                    outcome=bindparam("b_outcome"),
                    detail=bindparam("b_detail"),
                    provider_message_id=bindparam("b_provider_message_id"),
                    duplicate=bindparam("b_duplicate"),
                ),
                closing,
            )
            lost = self._apply_many(conn, [t for _, _, t in results])
        return [lost.get(str(t.key)) for _, _, t in results]

    def apply(self, transition: Transition) -> None:
        check_transition(transition.expected, transition.target)
        with self._engine.begin() as conn:
            if lost := self._apply_many(conn, [transition]):
                raise lost[str(transition.key)]

    def _apply_many(self, conn: Connection, ts: Sequence[Transition]) -> dict[str, DigestError]:
        """Applies the transitions whose guard holds; returns the others' errors by key.

        The wave's rows are read and locked first (`FOR UPDATE` on PostgreSQL, the write lock of
        SQLite's `BEGIN IMMEDIATE`), so which guards hold is read from the rows themselves and
        cannot change before the updates. The updates then go out one statement per shape of
        values (one for every `sent`, one for every retry, …), not one per item.
        """
        current: dict[str, Any] = {}
        for chunk in chunked(sorted({str(t.key) for t in ts}), KEYS):
            q = (
                select(wi.c.operation_key, wi.c.state, wi.c.lease_token)
                .where(wi.c.operation_key.in_(chunk))
                .order_by(wi.c.operation_key)
                .with_for_update()
            )
            current.update((r.operation_key, r) for r in conn.execute(q))
        lost: dict[str, DigestError] = {}
        holding: list[Transition] = []
        for t in ts:
            key = str(t.key)
            row = current.get(key)
            if row is None:
                lost[key] = UnknownWorkItem(f"no work item for {t.key}")
            elif row is _MOVED or (row.state, row.lease_token) != (t.expected.value, t.token):
                state = "moved by this batch" if row is _MOVED else row.state
                lost[key] = LostRace(
                    f"{t.key}: expected {t.expected.value} with token {t.token}; it is {state}"
                )
            else:
                holding.append(t)
                current[key] = _MOVED  # a second move of the same key in one batch loses
        # Transitions setting the same columns (and the same expressions) share one statement.
        shapes: dict[tuple[tuple[str, int | None], ...], list[tuple[Transition, dict[str, Any]]]]
        shapes = {}
        for t in holding:
            values = _update_values(t)
            shape = tuple(
                (c, id(v) if isinstance(v, ColumnElement) else None) for c, v in values.items()
            )
            shapes.setdefault(shape, []).append((t, values))
        for group in shapes.values():
            stmt = (
                update(wi)
                .where(
                    wi.c.operation_key == bindparam("w_key"),
                    wi.c.state == bindparam("w_state"),
                    wi.c.lease_token == bindparam("w_token"),
                )
                .values(
                    {
                        c: v if isinstance(v, ColumnElement) else bindparam(f"v_{c}")
                        for c, v in group[0][1].items()
                    }
                )
            )
            params = [
                {
                    "w_key": str(t.key),
                    "w_state": t.expected.value,
                    "w_token": t.token,
                    **{f"v_{c}": v for c, v in values.items() if not isinstance(v, ColumnElement)},
                }
                for t, values in group
            ]
            if (matched := conn.execute(stmt, params).rowcount) != len(params):
                # the rows are locked and their guards were just read: this is a bug, not a race
                raise RuntimeError(f"guarded update matched {matched} of {len(params)} locked rows")
        self._record_side_rows(conn, holding)
        return lost

    def _record_side_rows(self, conn: Connection, ts: Sequence[Transition]) -> None:
        """The dead-letter, replay and audit rows that go with applied transitions."""
        dying = [str(t.key) for t in ts if t.dead_letter_reason is not None]
        after: dict[str, Any] = {}
        for chunk in chunked(dying, KEYS):
            q = select(wi).where(wi.c.operation_key.in_(chunk))
            after.update((r["operation_key"], r) for r in conn.execute(q).mappings())
        dead = [
            {
                "operation_key": str(t.key),
                "period": str(t.key.period),
                "customer_id": t.key.customer_id,
                "reason": t.dead_letter_reason,
                "last_failure_class": after[str(t.key)]["last_failure_class"],
                "attempts": after[str(t.key)]["attempts"],
                "first_attempt_at": after[str(t.key)]["first_attempt_at"],
                "last_attempt_at": after[str(t.key)]["last_attempt_at"],
                "created_at": t.at,
            }
            for t in ts
            if t.dead_letter_reason is not None
        ]
        if dead:
            conn.execute(insert(dead_letters), dead)
        reopened = [
            {"b_key": str(t.key), "b_at": t.at} for t in ts if t.target is DeliveryState.PENDING
        ]
        if reopened:
            conn.execute(
                update(dead_letters)
                .where(
                    dead_letters.c.operation_key == bindparam("b_key"),
                    dead_letters.c.replayed_at.is_(None),
                )
                .values(replayed_at=bindparam("b_at")),
                reopened,
            )
        audits = [
            _audit_row(
                AuditEntry(
                    at=t.at,
                    actor=t.audit.actor,
                    action=t.audit.action,
                    key=t.key,
                    from_state=t.expected,
                    to_state=t.target,
                    reason=t.audit.reason,
                    period=t.key.period,
                )
            )
            for t in ts
            if t.audit is not None
        ]
        if audits:
            conn.execute(insert(audit_log), audits)

    def _missing_or_lost(
        self, conn: Connection, keys: Sequence[OperationKey], why: str
    ) -> dict[str, DigestError]:
        """The error for each key that matched no guarded row: unknown key, or a lost race."""
        states: dict[str, str] = {}
        for chunk in chunked([str(k) for k in keys], KEYS):
            q = select(wi.c.operation_key, wi.c.state).where(wi.c.operation_key.in_(chunk))
            states.update((k, state) for k, state in conn.execute(q))
        return {
            str(k): (
                LostRace(f"{k}: {why}; it is {states[str(k)]}")
                if str(k) in states
                else UnknownWorkItem(f"no work item for {k}")
            )
            for k in keys
        }

    def recover_expired_leases(self, now: datetime) -> LeaseRecovery:
        expired = and_(wi.c.state == DeliveryState.CLAIMED.value, wi.c.lease_expires_at <= now)
        open_attempt = exists().where(
            attempts.c.operation_key == wi.c.operation_key,
            attempts.c.lease_token == wi.c.lease_token,
            attempts.c.finished_at.is_(None),
        )
        with self._engine.begin() as conn:
            # Lock the expired claims first, so no worker can start an attempt on one of them
            # between the check for an open attempt and the move.
            rows = conn.execute(
                select(wi, open_attempt.label("open_attempt"))
                .where(expired)
                .with_for_update(of=wi, skip_locked=True)
            ).mappings()
            moves = [
                after_lease_expiry(sql_rows.work_item(r), r["open_attempt"], now) for r in rows
            ]
            if not moves:
                return LeaseRecovery((), ())
            # Locked rows cannot lose their guard; a lost one would be a bug, so it raises.
            if lost := self._apply_many(conn, moves):
                raise next(iter(lost.values()))
        return LeaseRecovery(
            tuple(sorted((t.key for t in moves if t.target is not DeliveryState.UNKNOWN), key=str)),
            tuple(sorted((t.key for t in moves if t.target is DeliveryState.UNKNOWN), key=str)),
        )

    def get(self, key: OperationKey) -> WorkItem | None:
        return self.items_of([key]).get(key)

    def items_of(self, keys: Sequence[OperationKey]) -> dict[OperationKey, WorkItem]:
        found: dict[OperationKey, WorkItem] = {}
        with self._engine.connect() as conn:
            for chunk in chunked({str(k) for k in keys}, KEYS):
                q = select(wi).where(wi.c.operation_key.in_(chunk))
                for r in conn.execute(q).mappings():
                    item = sql_rows.work_item(r)
                    found[item.key] = item
        return found

    def items(
        self, period: Period, states: Iterable[DeliveryState] | None = None
    ) -> list[WorkItem]:
        with self._engine.connect() as conn:
            rows = conn.execute(_period_items(period, states)).mappings()
            items = [sql_rows.work_item(r) for r in rows]
        return sorted(items, key=lambda i: str(i.key))

    def iter_items(
        self, period: Period, states: Iterable[DeliveryState] | None = None, page: int = 1_000
    ) -> Iterator[WorkItem]:
        q = _period_items(period, states)
        after: str | None = None
        while True:
            # keyset pagination: each page is its own short read, nothing is held open between
            paged = q if after is None else q.where(wi.c.operation_key > after)
            with self._engine.connect() as conn:
                rows = conn.execute(paged.order_by(wi.c.operation_key).limit(page)).mappings()
                items = [sql_rows.work_item(r) for r in rows]
            yield from items
            if len(items) < page:
                return
            after = str(items[-1].key)

    def attempts(self, key: OperationKey) -> list[Attempt]:
        q = (
            select(attempts)
            .where(attempts.c.operation_key == str(key))
            .order_by(attempts.c.attempt_id)
        )
        with self._engine.connect() as conn:
            return [sql_rows.attempt(r) for r in conn.execute(q).mappings()]

    def state_counts(self, period: Period) -> dict[DeliveryState, int]:
        q = select(wi.c.state, func.count()).where(wi.c.period == str(period)).group_by(wi.c.state)
        with self._engine.connect() as conn:
            return {DeliveryState(state): n for state, n in conn.execute(q)}

    def attempt_outcome_counts(self, period: Period) -> dict[str, int]:
        a = attempts
        of_period = a.c.operation_key.in_(
            select(wi.c.operation_key).where(wi.c.period == str(period))
        )
        outcome = func.coalesce(a.c.outcome, "open")
        by_outcome = select(outcome, func.count()).where(of_period).group_by(outcome)
        dupes = select(func.count()).where(of_period, a.c.duplicate.is_(True))
        with self._engine.connect() as conn:
            counts: dict[str, int] = {k: n for k, n in conn.execute(by_outcome)}
            if n_dupes := conn.execute(dupes).scalar_one():
                counts["duplicate"] = n_dupes
        return counts

    def open_periods(self) -> list[Period]:
        q = select(wi.c.period).where(wi.c.state.not_in([s.value for s in TERMINAL])).distinct()
        with self._engine.connect() as conn:
            return sorted(Period.parse(p) for p in conn.execute(q).scalars())

    # -- cleanup ---------------------------------------------------------------------------
    def clean(
        self, key: OperationKey, token: int, mode: CleanupMode, now: datetime
    ) -> CleanupReceipt:
        [receipt] = self.clean_many([(key, token)], mode, now)
        if isinstance(receipt, DigestError):
            raise receipt
        return receipt

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
        """
        keys = [str(k) for k, _ in items]
        locked = select(wi.c.operation_key, wi.c.state, wi.c.lease_token).where(
            wi.c.operation_key.in_(keys)
        )
        current = {k: (state, token) for k, state, token in conn.execute(locked.with_for_update())}
        cleaned = set(
            conn.execute(
                select(cleanups.c.operation_key).where(cleanups.c.operation_key.in_(keys))
            ).scalars()
        )
        movable = [
            k
            for k, token in ((str(k), t) for k, t in items)
            if k not in cleaned and current.get(k) == (DeliveryState.SENT.value, token)
        ]
        rows: dict[str, int] = {}
        if movable:
            dr = digest_rows
            rows = dict(
                conn.execute(
                    select(dr.c.operation_key, func.count())
                    .where(dr.c.operation_key.in_(movable))
                    .group_by(dr.c.operation_key)
                ).all()
            )
            conn.execute(
                insert(cleanups),
                [
                    {
                        "operation_key": k,
                        "period": str(OperationKey.parse(k).period),
                        "mode": mode.value,
                        "rows": rows.get(k, 0),
                        "claimed_at": now,
                        "completed_at": now,
                    }
                    for k in movable
                ],
            )
            conn.execute(
                update(wi)
                .where(wi.c.operation_key.in_(movable), wi.c.state == DeliveryState.SENT.value)
                .values(state=DeliveryState.CLEANED.value, cleaned_at=now, updated_at=now)
            )
            self._remove_rows(conn, movable, mode, now)
        receipts: list[CleanupReceipt | DigestError] = []
        for key, token in items:
            k = str(key)
            if k in cleaned:
                receipts.append(CleanupReceipt(key, "already_cleaned", 0))
            elif k in current and current[k] == (DeliveryState.SENT.value, token):
                receipts.append(CleanupReceipt(key, "cleaned", rows.get(k, 0)))
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
    ) -> None:
        dr = digest_rows
        if mode is CleanupMode.ARCHIVE:
            names = ["row_id", "operation_key", "period", "customer_id", "position", "payload"]
            # bind `now` through the archive column's own type so it is stored as UTC
            source = select(
                *[dr.c[n] for n in names],
                literal(now, digest_rows_archive.c.archived_at.type),
            ).where(dr.c.operation_key.in_(keys))
            conn.execute(insert(digest_rows_archive).from_select([*names, "archived_at"], source))
        conn.execute(dr.delete().where(dr.c.operation_key.in_(keys)))

    # -- dead letters, audit, invariants ---------------------------------------------------
    def dead_letters(self, period: Period) -> list[DeadLetterRecord]:
        q = (
            select(dead_letters)
            .where(dead_letters.c.period == str(period))
            .order_by(dead_letters.c.dead_letter_id)
        )
        with self._engine.connect() as conn:
            return [sql_rows.dead_letter(r) for r in conn.execute(q).mappings()]

    def record_audit(self, entry: AuditEntry) -> None:
        with self._engine.begin() as conn:
            self._insert_audit(conn, entry)

    def _insert_audit(self, conn: Connection, e: AuditEntry) -> None:
        conn.execute(insert(audit_log).values(_audit_row(e)))

    def audit_log(self, period: Period | None = None) -> list[AuditEntry]:
        q = select(audit_log).order_by(audit_log.c.audit_id)
        if period is not None:
            q = q.where(audit_log.c.period == str(period))
        with self._engine.connect() as conn:
            return [sql_rows.audit_entry(r) for r in conn.execute(q).mappings()]

    def check_invariants(
        self, period: Period, now: datetime, names: Collection[str] | None = None
    ) -> list[InvariantResult]:
        with self._engine.connect() as conn:
            return evaluate_invariants(conn, period, now, names)

    # -- regenerated content ---------------------------------------------------------------
    def replace_digest_rows(
        self, keys: Sequence[OperationKey], rows: Iterable[DigestRow]
    ) -> RowReplacement:
        wanted = {str(k): k for k in keys}
        new = list(rows)
        strays = sorted({str(r.key) for r in new} - wanted.keys())
        if strays:
            raise ValueError(f"rows of keys not being replaced: {', '.join(strays[:3])}")
        never_sent = [s.value for s in REGENERABLE]
        dr = digest_rows
        replaced: set[str] = set()
        refused: dict[OperationKey, DeliveryState | None] = {}
        removed = written = 0
        with self._engine.begin() as conn:
            for chunk in chunked(wanted, KEYS):
                # Locked until commit (PostgreSQL; SQLite's BEGIN IMMEDIATE serialises writers),
                # so no worker claims an item between this read and the rows' replacement.
                q = select(wi.c.operation_key, wi.c.state).where(wi.c.operation_key.in_(chunk))
                states: dict[str, str] = {k: s for k, s in conn.execute(q.with_for_update())}
                movable = [k for k in chunk if states.get(k) in never_sent]
                refused.update(
                    (wanted[k], DeliveryState(states[k]) if k in states else None)
                    for k in chunk
                    if states.get(k) not in never_sent
                )
                if not movable:
                    continue
                # the state guard again in the statement itself: the compare-and-set on state
                guard = exists().where(
                    wi.c.operation_key == dr.c.operation_key, wi.c.state.in_(never_sent)
                )
                deleted = conn.execute(dr.delete().where(dr.c.operation_key.in_(movable), guard))
                removed += deleted.rowcount
                replaced.update(movable)
            values = [
                {
                    "operation_key": str(r.key),
                    "period": str(r.key.period),
                    "customer_id": r.key.customer_id,
                    "position": r.position,
                    "payload": r.payload,
                }
                for r in new
                if str(r.key) in replaced
            ]
            for part in chunked(values, CHUNK):
                conn.execute(insert(dr), part)
                written += len(part)
        return RowReplacement(frozenset(wanted[k] for k in replaced), refused, removed, written)
