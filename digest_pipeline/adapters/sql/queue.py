"""The work queue: enqueue, claim with fencing tokens, attempts, guarded moves one statement per wave."""

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    and_,
    bindparam,
    cast,
    exists,
    func,
    insert,
    literal,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql

from digest_pipeline.adapters.sql import rows as sql_rows
from digest_pipeline.adapters.sql.base import (
    ANALYZE_AFTER,
    KEYS,
    SqlBase,
    audit_row,
    due_clause,
    locked_items,
    sqlite_statistics_outgrown,
    update_many,
    wi,
)
from digest_pipeline.adapters.sql.schema import (
    attempts,
    audit_log,
    dead_letters,
    eligibility_snapshot,
    period_runs,
    suppressions,
)
from digest_pipeline.domain.chunks import chunked
from digest_pipeline.domain.errors import DigestError, LostRace, SnapshotMissing, UnknownWorkItem
from digest_pipeline.domain.failures import SendOutcome
from digest_pipeline.domain.model import (
    AttemptTicket,
    AuditEntry,
    Claim,
    ClearDedupe,
    EnqueueReceipt,
    LeaseRecovery,
    RefundBudget,
    Reopen,
    Transition,
)
from digest_pipeline.domain.periods import KEY_PREFIX, Period
from digest_pipeline.domain.states import DeliveryState, check_transition
from digest_pipeline.domain.transitions import DETAIL_LENGTH, after_lease_expiry
from digest_pipeline.ports import WorkQueue

#: marks a key already moved earlier in the same batch
_MOVED: Any = object()
#: a throttled attempt gives its budget unit back (one shared expression, so transitions that
#: refund group into one statement)
REFUND = wi.c.budget_used - 1


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


def _still_held(at: Any) -> tuple[ColumnElement[bool], ...]:
    """Whether an attempt may start: the claim's lease is live and its customer not suppressed.

    `at` is a value or a parameter; the suppression list is read by its primary key.
    """
    return (
        wi.c.state == DeliveryState.CLAIMED.value,
        wi.c.lease_expires_at > at,
        ~exists().where(suppressions.c.customer_id == wi.c.customer_id),
    )


def _starting(at: Any) -> dict[str, Any]:
    """What starting an attempt sets on its item: the count, the budget and the first times."""
    return {
        "attempts": wi.c.attempts + 1,
        "budget_used": wi.c.budget_used + 1,
        "first_attempt_at": func.coalesce(wi.c.first_attempt_at, at),
        "window_started_at": func.coalesce(wi.c.window_started_at, at),
        "last_attempt_at": at,
        "updated_at": at,
    }


#: what starting an attempt writes, in the order both INSERT … SELECTs below select it
_ATTEMPT_COLUMNS = [
    "operation_key",
    "number",
    "lease_token",
    "worker",
    "started_at",
    "duplicate",
    "mailer",
]


def _start_on_pg() -> Any:
    """`start_attempts` on PostgreSQL: the attempts of claims still held, in one statement.

    Built once, so SQLAlchemy neither rebuilds it nor recomputes its cache key per wave.
    """
    at = bindparam("s_now", type_=wi.c.updated_at.type)
    held = (
        func.unnest(
            bindparam("s_keys", type_=postgresql.ARRAY(wi.c.operation_key.type)),
            bindparam("s_tokens", type_=postgresql.ARRAY(wi.c.lease_token.type)),
        )
        .table_valued("k", "t")
        .render_derived(name="held")
    )
    started = (
        update(wi)
        .where(
            wi.c.operation_key == held.c.k,
            wi.c.lease_token == held.c.t,
            *_still_held(at),
        )
        .values(_starting(at))
        .returning(wi.c.operation_key, wi.c.attempts, wi.c.lease_token)
        .cte("started")
    )
    source = select(
        started.c.operation_key,
        started.c.attempts,
        started.c.lease_token,
        bindparam("s_worker", type_=attempts.c.worker.type),
        at,
        literal(False),
        bindparam("s_mailer", type_=attempts.c.mailer.type),
    )
    return (
        insert(attempts)
        .from_select(_ATTEMPT_COLUMNS, source)
        .returning(attempts.c.operation_key, attempts.c.number, attempts.c.attempt_id)
    )


_START_ON_PG = _start_on_pg()


def _attempts_from_items() -> Any:
    """SQLite's INSERT of one owner's attempts, each from its item's row just started."""
    source = (
        select(
            wi.c.operation_key,
            wi.c.attempts,
            wi.c.lease_token,
            bindparam("a_worker", type_=attempts.c.worker.type),
            bindparam("a_now", type_=attempts.c.started_at.type),
            literal(False),
            bindparam("a_mailer", type_=attempts.c.mailer.type),
        )
        .where(wi.c.operation_key.in_(bindparam("a_keys", expanding=True)))
        .order_by(wi.c.operation_key)
    )
    return (
        insert(attempts)
        .from_select(_ATTEMPT_COLUMNS, source)
        .returning(attempts.c.operation_key, attempts.c.attempt_id)
    )


_ATTEMPTS_FROM_ITEMS = _attempts_from_items()


def _dead_letters_on_pg() -> Any:
    """The dead-letter rows of some items on PostgreSQL, copied from the items' rows.

    Each row's own reason and time come in as arrays beside the keys.
    """
    given = (
        func.unnest(
            bindparam("d_keys", type_=postgresql.ARRAY(wi.c.operation_key.type)),
            bindparam("d_reasons", type_=postgresql.ARRAY(dead_letters.c.reason.type)),
            bindparam("d_at", type_=postgresql.ARRAY(dead_letters.c.created_at.type)),
        )
        .table_valued("k", "reason", "at")
        .render_derived(name="dying")
    )
    source = (
        select(
            wi.c.operation_key,
            wi.c.period,
            wi.c.customer_id,
            given.c.reason,
            wi.c.last_failure_class,
            wi.c.attempts,
            wi.c.first_attempt_at,
            wi.c.last_attempt_at,
            given.c.at,
        )
        .where(wi.c.operation_key == given.c.k)
        .order_by(wi.c.operation_key)
    )
    # every column but the row's own id and its replay, in the table's order, as selected above
    columns = [c.name for c in dead_letters.c if c.name not in ("dead_letter_id", "replayed_at")]
    return insert(dead_letters).from_select(columns, source)


_DEAD_LETTERS_ON_PG = _dead_letters_on_pg()
#: what closing an attempt sets (each row its own values); the attempt must still be open
_CLOSING: dict[str, ColumnElement[Any] | None] = dict.fromkeys(
    ("finished_at", "outcome", "detail", "provider_message_id", "duplicate")
)


class SqlWorkQueue(SqlBase, WorkQueue):
    """The `WorkQueue` role of `SqlLedger`."""

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

    def start_attempts(
        self, claims: Sequence[Claim], now: datetime, *, mailer: str
    ) -> list[AttemptTicket | DigestError]:
        if not claims:
            return []
        with self._engine.begin() as conn:
            return self._start(conn, claims, now, mailer)

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

    def _start(
        self, conn: Connection, claims: Sequence[Claim], now: datetime, mailer: str
    ) -> list[AttemptTicket | DigestError]:
        """`start_attempts` in the caller's transaction."""
        numbers: dict[str, int] = {}
        ids: dict[str, int] = {}
        owners = {c.owner for c in claims}
        if self._pg and len(owners) == 1:
            # one statement a chunk: the guarded UPDATE as a CTE feeding the INSERT
            for chunk in chunked(claims, KEYS):
                params = {
                    "s_keys": [str(c.key) for c in chunk],
                    "s_tokens": [c.token for c in chunk],
                    "s_now": now,
                    "s_worker": next(iter(owners)),
                    "s_mailer": mailer,
                }
                for key, number, attempt_id in conn.execute(_START_ON_PG, params):
                    numbers[key], ids[key] = number, attempt_id
        else:
            self._start_in_two_statements(conn, claims, now, mailer, numbers, ids)
        unstarted = [c for c in claims if str(c.key) not in numbers]
        if unstarted:
            self._end_suppressed_claims(conn, unstarted, now)
        missing = self._missing_or_lost(
            conn, [c.key for c in unstarted], "no attempt started (lease lost or suppressed)"
        )
        return [
            AttemptTicket(ids[k], c.key, numbers[k], c.token, now)
            if (k := str(c.key)) in numbers
            else missing[k]
            for c in claims
        ]

    def _end_suppressed_claims(
        self, conn: Connection, claims: Sequence[Claim], now: datetime
    ) -> None:
        """Ends as `suppressed` those of `claims` (none started) whose customer is on the list.

        In the transaction that refused to start them; `SqlSuppressions` does it, a queue
        without the list has nothing to end.
        """

    def _start_in_two_statements(
        self,
        conn: Connection,
        claims: Sequence[Claim],
        now: datetime,
        mailer: str,
        numbers: dict[str, int],
        ids: dict[str, int],
    ) -> None:
        """SQLite's (and mixed owners') form: the guarded UPDATE, then the INSERT of attempts."""
        for chunk in chunked(claims, KEYS):
            guard = [(str(c.key), c.token) for c in chunk]
            numbers.update(
                conn.execute(
                    update(wi)
                    .where(
                        # the plain IN gives SQLite an index to use; it scans for row values
                        wi.c.operation_key.in_([k for k, _ in guard]),
                        tuple_(wi.c.operation_key, wi.c.lease_token).in_(guard),
                        *_still_held(now),
                    )
                    .values(_starting(now))
                    .returning(wi.c.operation_key, wi.c.attempts)
                ).all()
            )
        owners = {c.owner for c in claims}
        if len(owners) == 1:
            # each attempt copied from its item's row as the guarded update left it (number and
            # token), in one statement a chunk: no multi-row VALUES text built per wave
            started = sorted(numbers)
            for keys in chunked(started, KEYS):
                params = {
                    "a_keys": keys,
                    "a_worker": next(iter(owners)),
                    "a_now": now,
                    "a_mailer": mailer,
                }
                ids.update(conn.execute(_ATTEMPTS_FROM_ITEMS, params).all())
            return
        rows = [
            {
                "operation_key": str(c.key),
                "number": numbers[str(c.key)],
                "lease_token": c.token,
                "worker": c.owner,
                "started_at": now,
                "duplicate": False,
                "mailer": mailer,
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

    def complete_many(
        self, results: Sequence[tuple[AttemptTicket, SendOutcome, Transition]]
    ) -> list[DigestError | None]:
        if not results:
            return []
        for _, _, t in results:
            check_transition(t.expected, t.target)
        with self._engine.begin() as conn:
            return self._complete(conn, results)

    def _complete(
        self, conn: Connection, results: Sequence[tuple[AttemptTicket, SendOutcome, Transition]]
    ) -> list[DigestError | None]:
        """`complete_many` in the caller's transaction (its transitions already checked)."""
        closing = [
            (
                (ticket.attempt_id,),
                {
                    "finished_at": t.at,
                    "outcome": outcome.label,
                    "detail": outcome.detail[:200],
                    "provider_message_id": outcome.provider_message_id,
                    "duplicate": outcome.duplicate,
                },
            )
            for ticket, outcome, t in results
        ]
        # Close every attempt, even one whose transition loses: it is evidence for
        # reconciliation, and it commits with the transitions that did apply.
        update_many(conn, attempts, ("attempt_id",), _CLOSING, closing, unset=("finished_at",))
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
            q = locked_items(chunk, self._pg, wi.c.operation_key, wi.c.state, wi.c.lease_token)
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
            columns = {
                c: v if isinstance(v, ColumnElement) else None for c, v in group[0][1].items()
            }
            rows = [((str(t.key), t.expected.value, t.token), values) for t, values in group]
            matched = update_many(
                conn, wi, ("operation_key", "state", "lease_token"), columns, rows
            )
            if matched != len(rows):
                # the rows are locked and their guards were just read: this is a bug, not a race
                raise RuntimeError(f"guarded update matched {matched} of {len(rows)} locked rows")
        self._record_side_rows(conn, holding)
        return lost

    def _record_side_rows(self, conn: Connection, ts: Sequence[Transition]) -> None:
        """The dead-letter, replay and audit rows that go with applied transitions."""
        dying = [t for t in ts if t.dead_letter_reason is not None]
        if self._pg:
            # each dead letter copies its item's counters as the updates just left them,
            # straight from the row: one INSERT … SELECT, no read back and no second send
            for chunk in chunked(dying, KEYS):
                params = {
                    "d_keys": [str(t.key) for t in chunk],
                    "d_reasons": [t.dead_letter_reason for t in chunk],
                    "d_at": [t.at for t in chunk],
                }
                conn.execute(_DEAD_LETTERS_ON_PG, params)
        else:
            self._dead_letters_on_sqlite(conn, dying)
        reopened = [((str(t.key),), {"replayed_at": t.at}) for t in ts if t.has(Reopen)]
        if reopened:
            update_many(
                conn,
                dead_letters,
                ("operation_key",),
                {"replayed_at": None},
                reopened,
                unset=("replayed_at",),
            )
        audits = [
            audit_row(
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

    def _dead_letters_on_sqlite(self, conn: Connection, dying: Sequence[Transition]) -> None:
        """The dead-letter rows, each item's counters read back after the updates."""
        after: dict[str, Any] = {}
        for chunk in chunked([str(t.key) for t in dying], KEYS):
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
            for t in dying
        ]
        if dead:
            conn.execute(insert(dead_letters), dead)

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
