"""The start of attempts: the guarded update of each held claim, then the INSERT of its attempt.

The update checks the claim's lease and the suppression list; on PostgreSQL both go out as one
statement a chunk. Its own module because its statements are built once, at import, and
`SqlSuppressions` ends the claims it refuses.
"""

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    bindparam,
    exists,
    func,
    insert,
    literal,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql

from digest_pipeline.adapters.sql.base import KEYS, SqlBase, wi
from digest_pipeline.adapters.sql.schema import attempts, suppressions
from digest_pipeline.domain.chunks import chunked
from digest_pipeline.domain.errors import DigestError
from digest_pipeline.domain.model import AttemptTicket, Claim
from digest_pipeline.domain.states import DeliveryState


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


class SqlAttemptStarts(SqlBase):
    """The start of attempts on held claims, before the mailer is called."""

    def start_attempts(
        self, claims: Sequence[Claim], now: datetime, *, mailer: str
    ) -> list[AttemptTicket | DigestError]:
        if not claims:
            return []
        with self._engine.begin() as conn:
            return self._start(conn, claims, now, mailer)

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
