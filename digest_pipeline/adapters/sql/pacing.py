"""The `SendBudget` port in SQL: one `send_pacing` row per mailer identity.

A slot is taken by one `UPDATE … RETURNING` that moves the row's next slot on by the interval,
so concurrent senders in any number of processes each get their own slot: PostgreSQL's row lock
and SQLite's write lock serialise the statement, and no sender reads a slot another took.
"""

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Engine, case, func, select, update
from sqlalchemy.dialects import postgresql, sqlite

from digest_pipeline.adapters.sql.schema import send_pacing
from digest_pipeline.domain.pacing import Pause
from digest_pipeline.ports import SendBudget

sp = send_pacing
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _us(at: datetime) -> int:
    return (at - _EPOCH) // timedelta(microseconds=1)


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

    def take_slot(
        self, mailer: str, interval: timedelta, now: datetime, horizon: datetime
    ) -> tuple[datetime | None, Pause | None]:
        step = interval // timedelta(microseconds=1)
        start = self._latest(sp.c.next_slot_us, _us(now), func.coalesce(sp.c.paused_until_us, 0))
        # only a slot within the horizon is taken: a sender that cannot use its slot must not
        # push every later sender's further out
        take = (
            update(sp)
            .where(sp.c.mailer == mailer, start <= _us(horizon))
            .values(next_slot_us=start + step)
            .returning(sp.c.next_slot_us, sp.c.paused_until_us, sp.c.paused_why)
        )
        with self._engine.begin() as conn:
            taken = conn.execute(take).first()
        if taken is None and self.current_pause(mailer) is None:
            # the mailer's first slot: make its row, then take the slot as any other
            self._ensure(mailer)
            with self._engine.begin() as conn:
                taken = conn.execute(take).first()
        if taken is None:
            return None, self._pause_at(mailer, now)
        next_us, until_us, why = taken
        pause = None if until_us is None or until_us <= _us(now) else Pause(_at(until_us), why)
        return _at(next_us - step), pause

    def _pause_at(self, mailer: str, now: datetime) -> Pause | None:
        pause = self.current_pause(mailer)
        return pause if pause is not None and pause.until > now else None

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
