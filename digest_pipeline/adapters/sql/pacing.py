"""The `SendBudget` port in SQL: one `send_pacing` row per mailer identity.

A slot is taken by one `UPDATE … RETURNING` that moves the row's next slot on by the interval,
and only once that slot is due: concurrent senders in any number of processes each get their
own slot (PostgreSQL's row lock and SQLite's write lock serialise the statement), and a sender
that was late leaves at once instead of holding a slot another sender's request would crowd.
"""

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Engine, case, func, select, update
from sqlalchemy.dialects import postgresql, sqlite

from digest_pipeline.adapters.sql.schema import send_pacing
from digest_pipeline.domain.pacing import SLACK, Pause, Slot
from digest_pipeline.ports import SendBudget

sp = send_pacing
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _us(at: datetime) -> int:
    return (at - _EPOCH) // timedelta(microseconds=1)


def _us_of(span: timedelta) -> int:
    return span // timedelta(microseconds=1)


def _at(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


class SqlSendBudget(SendBudget):
    """The send slots and pauses kept in the ledger database at `engine`."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._pg = engine.dialect.name == "postgresql"

    def _latest(self, first: ColumnElement[int], *rest: ColumnElement[int] | int) -> Any:
        # SQLite's scalar max() with several arguments is PostgreSQL's greatest()
        return func.greatest(first, *rest) if self._pg else func.max(first, *rest)

    def _ensure(self, mailer: str) -> None:
        insert = (postgresql if self._pg else sqlite).insert
        with self._engine.begin() as conn:
            conn.execute(insert(sp).values(mailer=mailer, next_slot_us=0).on_conflict_do_nothing())

    def take_slot(self, mailer: str, interval: timedelta, now: datetime) -> Slot:
        step = interval // timedelta(microseconds=1)
        at = _us(now)
        paused = func.coalesce(sp.c.paused_until_us, 0)
        # the slot this take fills: the scheduled one when it is at most SLACK late; else now,
        # so that a first send, or one after a pause or a quiet spell, starts a fresh schedule
        on_time = self._latest(sp.c.next_slot_us, paused) >= at - _us_of(SLACK)
        start = case((on_time, self._latest(sp.c.next_slot_us, paused)), else_=at)
        take = (
            update(sp)
            .where(sp.c.mailer == mailer, sp.c.next_slot_us <= at, paused <= at)
            .values(next_slot_us=start + step)
            .returning(sp.c.next_slot_us)
        )
        with self._engine.begin() as conn:
            taken = conn.execute(take).first()
        if taken is not None:
            return Slot(True, _at(taken[0]))
        with self._engine.begin() as conn:
            row = conn.execute(
                select(sp.c.next_slot_us, sp.c.paused_until_us, sp.c.paused_why).where(
                    sp.c.mailer == mailer
                )
            ).first()
        if row is None:
            # the mailer's first slot: make its row; the caller tries again at once
            self._ensure(mailer)
            return Slot(False, now)
        next_us, until_us, why = row
        pause = None if until_us is None or until_us <= at else Pause(_at(until_us), why)
        return Slot(False, _at(max(next_us, until_us or 0)), pause)

    def pause(self, mailer: str, pause: Pause) -> None:
        self._ensure(mailer)
        until = _us(pause.until)
        earlier = func.coalesce(sp.c.paused_until_us, 0) < until
        with self._engine.begin() as conn:
            conn.execute(
                update(sp)
                .where(sp.c.mailer == mailer)
                .values(
                    paused_until_us=self._latest(func.coalesce(sp.c.paused_until_us, 0), until),
                    paused_why=case((earlier, pause.why), else_=sp.c.paused_why),
                )
            )

    def current_pause(self, mailer: str) -> Pause | None:
        with self._engine.connect() as conn:
            row = conn.execute(
                select(sp.c.paused_until_us, sp.c.paused_why).where(sp.c.mailer == mailer)
            ).first()
        if row is None or row[0] is None:
            return None
        return Pause(_at(row[0]), row[1])
