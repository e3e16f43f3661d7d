"""The `FeedbackStore` port in SQL: the provider events, and the ledger's suppression list.

Events are written with `INSERT … ON CONFLICT DO NOTHING` on (provider, event id), so concurrent
requests for the same event record it once, on SQLite and PostgreSQL alike; suppressions are the
ledger's own (`adapters/sql/suppressions.py`), which cancel a customer's unclaimed items in the
same transaction. It also holds the reads of the ledger `digest serve` needs that the `Ledger`
port lacks: whether a customer id is known, and which attempt a provider message id names.
"""

from datetime import timedelta
from typing import Any

from sqlalchemy import Engine, select, update
from sqlalchemy.dialects import postgresql, sqlite

from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.adapters.sql.schema import (
    attempts,
    customers,
    eligibility_snapshot,
    provider_events,
)
from digest_pipeline.domain.feedback import (
    ClaimStatus,
    EventClaim,
    EventOutcome,
    EventRecord,
    EventType,
)
from digest_pipeline.domain.periods import DEFAULT_INSTANCE, OperationKey
from digest_pipeline.ports import FeedbackStore

pe = provider_events


def concurrent_callers(engine: Engine) -> int:
    """How many threads usefully call the stores on `engine` at once.

    SQLite runs one transaction at a time (`BEGIN IMMEDIATE` on every one, engine.py): more
    callers only wait in SQLite's busy handler, which sleeps in growing steps. PostgreSQL takes
    as many as the engine's pool holds.
    """
    if engine.dialect.name == "sqlite":
        return 1
    size = getattr(engine.pool, "size", None)
    return max(1, size()) if callable(size) else 8


def _event_row(r: EventRecord) -> dict[str, Any]:
    return {
        "provider": r.provider,
        "event_id": r.event_id,
        "type": r.type.value,
        "operation_key": None if r.operation_key is None else str(r.operation_key),
        "provider_message_id": r.provider_message_id,
        "received_at": r.received_at,
        "outcome": r.outcome.value,
    }


class SqlFeedbackStore(FeedbackStore):
    """Provider events over an SQLAlchemy engine (schema from `migrate`), and the ledger's list."""

    def __init__(self, engine: Engine, instance: str = DEFAULT_INSTANCE) -> None:
        self._engine = engine
        self._dialect: Any = postgresql if engine.dialect.name == "postgresql" else sqlite
        self._ledger = SqlLedger(engine, instance)

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def suppression_list(self) -> SqlLedger:
        return self._ledger

    def known_customer(self, customer_id: str) -> bool:
        # the source by its primary key first; a snapshot (no index by customer alone) is read
        # only for an id the source no longer has, which only a valid token gets this far with
        in_source = select(customers.c.customer_id).where(customers.c.customer_id == customer_id)
        snapshotted = (
            select(eligibility_snapshot.c.customer_id)
            .where(eligibility_snapshot.c.customer_id == customer_id)
            .limit(1)
        )
        with self._engine.connect() as conn:
            if conn.execute(in_source).first() is not None:
                return True
            return conn.execute(snapshotted).first() is not None

    def key_of_provider_message(self, provider_message_id: str) -> OperationKey | None:
        query = (
            select(attempts.c.operation_key)
            .where(attempts.c.provider_message_id == provider_message_id)
            .order_by(attempts.c.attempt_id.desc())
            .limit(1)
        )
        with self._engine.connect() as conn:
            key = conn.execute(query).scalar_one_or_none()
        return None if key is None else OperationKey.parse(key)

    def begin_event(self, record: EventRecord, lease: timedelta) -> EventClaim:
        mine = (pe.c.provider == record.provider, pe.c.event_id == record.event_id)
        insert = (
            self._dialect.insert(pe)
            .values(_event_row(record))
            .on_conflict_do_nothing()
            .returning(pe.c.event_id)
        )
        with self._engine.begin() as conn:
            if conn.execute(insert).first() is not None:
                return EventClaim(ClaimStatus.NEW)
            found = conn.execute(select(pe.c.outcome, pe.c.received_at).where(*mine)).one()
            if found.outcome != EventOutcome.RECEIVED.value:
                return EventClaim(ClaimStatus.DONE, EventOutcome(found.outcome))
            if found.received_at > record.received_at - lease:
                return EventClaim(ClaimStatus.IN_PROGRESS)
            # an abandoned `received` row: take it over, as a compare-and-set on its time
            take_over = (
                update(pe)
                .where(
                    *mine,
                    pe.c.outcome == EventOutcome.RECEIVED.value,
                    pe.c.received_at == found.received_at,
                )
                .values(
                    received_at=record.received_at,
                    operation_key=_event_row(record)["operation_key"],
                )
                .returning(pe.c.event_id)
            )
            took = conn.execute(take_over).first() is not None
        return EventClaim(ClaimStatus.RESUMED if took else ClaimStatus.IN_PROGRESS)

    def finish_event(self, provider: str, event_id: str, outcome: EventOutcome) -> None:
        finish = (
            update(pe)
            .where(
                pe.c.provider == provider,
                pe.c.event_id == event_id,
                pe.c.outcome == EventOutcome.RECEIVED.value,
            )
            .values(outcome=outcome.value)
        )
        with self._engine.begin() as conn:
            conn.execute(finish)

    def provider_events(self) -> list[EventRecord]:
        with self._engine.connect() as conn:
            rows = conn.execute(select(pe).order_by(pe.c.provider, pe.c.event_id))
            return [
                EventRecord(
                    provider=r.provider,
                    event_id=r.event_id,
                    type=EventType(r.type),
                    operation_key=(
                        None if r.operation_key is None else OperationKey.parse(r.operation_key)
                    ),
                    provider_message_id=r.provider_message_id,
                    received_at=r.received_at,
                    outcome=EventOutcome(r.outcome),
                )
                for r in rows
            ]
