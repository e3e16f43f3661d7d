"""The statement fragments the ledger's roles share.

The due items, a locking read in key order, a dialect's `IN` and a period's items: expressions
only, with no connection, that each role composes into its own statements.
"""

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, func, literal, select, text
from sqlalchemy.dialects import postgresql

from digest_pipeline.adapters.sql.base import wi
from digest_pipeline.adapters.sql.schema import CLAIMABLE_SQL
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.states import DeliveryState


def due_clause(now: datetime, period: Period | None) -> ColumnElement[bool]:
    """Items `claim_due` may hand out now (in one period, or any)."""
    due = and_(text(f"work_items.{CLAIMABLE_SQL}"), wi.c.next_attempt_at <= now)
    return due if period is None else and_(due, wi.c.period == str(period))


def locked_items(keys: Sequence[str], pg: bool, *columns: ColumnElement[Any]) -> Select[Any]:
    """`columns` of the work items `keys`, read and locked (`FOR UPDATE`) in key order.

    Every transaction that locks many items takes them in this one order, whatever its plan: two
    cleaners of one page, one planned as a scan of the table and one through the key index,
    otherwise locked its rows in opposite orders, and PostgreSQL aborted one with `deadlock
    detected`. (SQLite's `BEGIN IMMEDIATE` serialises writers; the order costs it nothing.)
    """
    return (
        select(*columns)
        .where(one_of(wi.c.operation_key, keys, pg))
        .order_by(wi.c.operation_key)
        .with_for_update()
    )


def one_of(column: Any, values: Iterable[Any], pg: bool) -> ColumnElement[bool]:
    """`column IN values`; on PostgreSQL `column = ANY(array)`, one parameter however many.

    A 500-item `IN (…)` list is 500 parameters the server plans anew each time; the array form
    is one parameter, and reads a week's orders in far less time.
    """
    if pg:
        clause: ColumnElement[bool] = column == func.any(
            literal(list(values), postgresql.ARRAY(column.type))
        )
        return clause
    listed: ColumnElement[bool] = column.in_(list(values))
    return listed


def period_items(period: Period, states: Iterable[DeliveryState] | None) -> Select[Any]:
    """A period's work items, optionally only in some states."""
    q = select(wi).where(wi.c.period == str(period))
    return q if states is None else q.where(wi.c.state.in_([s.value for s in states]))
