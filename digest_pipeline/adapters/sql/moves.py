"""Guarded moves of work items, one statement per wave, and the completion of attempts.

Its own module because every path that moves an item goes through `_apply_many`: the completion
of an attempt, lease recovery and suppressions.
"""

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, Connection, bindparam, func, insert, select
from sqlalchemy.dialects import postgresql

from digest_pipeline.adapters.sql.base import KEYS, SqlBase, audit_row, wi
from digest_pipeline.adapters.sql.bulk import update_many
from digest_pipeline.adapters.sql.clauses import locked_items
from digest_pipeline.adapters.sql.schema import attempts, audit_log, dead_letters
from digest_pipeline.domain.chunks import chunked
from digest_pipeline.domain.errors import DigestError, LostRace, UnknownWorkItem
from digest_pipeline.domain.failures import SendOutcome
from digest_pipeline.domain.model import (
    AttemptTicket,
    ClearDedupe,
    RefundBudget,
    Reopen,
    Transition,
)
from digest_pipeline.domain.states import DeliveryState, check_transition
from digest_pipeline.domain.transitions import DETAIL_LENGTH

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


class SqlMoves(SqlBase):
    """The guarded moves of `SqlWorkQueue`, and the completion of attempts that ends in one."""

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
        audits = [audit_row(entry) for t in ts if (entry := t.audit_entry()) is not None]
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
