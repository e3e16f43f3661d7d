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


#: the pause's end as a number: 0 for a mailer never paused
_paused = func.coalesce(sp.c.paused_until_us, 0)


def _us_of(span: timedelta) -> int:
    return span // timedelta(microseconds=1)


def _us(at: datetime) -> int:
    return _us_of(at - _EPOCH)


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
        at = _us(now)
        # the slot this take fills: the scheduled one when it is at most SLACK late; else now,
        # so that a first send, or one after a pause or a quiet spell, starts a fresh schedule
        due = self._latest(sp.c.next_slot_us, _paused)
        start = case((due >= at - _us_of(SLACK), due), else_=at)
        take = (
            update(sp)
            .where(sp.c.mailer == mailer, due <= at)
            .values(next_slot_us=start + _us_of(interval))
            .returning(sp.c.next_slot_us)
        )
        with self._engine.begin() as conn:
            taken = conn.execute(take).first()
        if taken is not None:
            return Slot(True, _at(taken[0]))
        row = self._read(mailer)
        if row is None:
            # the mailer's first slot: make its row; the caller tries again at once
            self._ensure(mailer)
            return Slot(False, now)
        next_slot, last = row
        if last is None or last.until <= now:
            return Slot(False, next_slot)
        return Slot(False, max(next_slot, last.until), last)

    def pause(self, mailer: str, pause: Pause) -> None:
        self._ensure(mailer)
        until = _us(pause.until)
        with self._engine.begin() as conn:
            conn.execute(
                update(sp)
                .where(sp.c.mailer == mailer)
                .values(
                    paused_until_us=self._latest(_paused, until),
                    paused_why=case((_paused < until, pause.why), else_=sp.c.paused_why),
                )
            )

    def current_pause(self, mailer: str) -> Pause | None:
        row = self._read(mailer)
        return None if row is None else row[1]

    def _read(self, mailer: str) -> tuple[datetime, Pause | None] | None:
        """The mailer's next slot and latest pause; None before its first use."""
        with self._engine.connect() as conn:
            row = conn.execute(
                select(sp.c.next_slot_us, sp.c.paused_until_us, sp.c.paused_why).where(
                    sp.c.mailer == mailer
                )
            ).first()
        if row is None:
            return None
        next_us, until_us, why = row
        # the table's CHECK keeps the pause's end and reason together
        return _at(next_us), None if until_us is None else Pause(_at(until_us), why)
