"""The mark `digest seed` leaves in a ledger, so the demo's public secret works only on the demo.

`seed_demo` writes one `demo_seed` row in the transaction that inserts the demo shop; `digest run`
and `digest serve` read it to decide whether the public `DIGEST_UNSUBSCRIBE_SECRET` default may
be used (`domain.unsubscribe.public_secret_refusal`). A ledger of real customers never has it:
`require_demo_or_empty` refuses, in that same transaction, a ledger that holds shop data or a
run's work and no mark, so the mark is set only on an empty ledger (design §8).
"""

from datetime import datetime

from sqlalchemy import Connection, Engine, literal, select
from sqlalchemy.dialects import postgresql, sqlite

from digest_pipeline.adapters.sql.schema import (
    customers,
    demo_seed,
    orders,
    period_runs,
    products,
    work_items,
)
from digest_pipeline.domain.errors import DigestError

#: rows in any of these mean a shop's own data, or a run over it
REAL_DATA = (customers, products, orders, period_runs, work_items)


class RealLedgerRefused(DigestError):
    """`digest seed` was pointed at a ledger with a shop's data or work and no demo mark."""


def require_demo_or_empty(conn: Connection) -> None:
    """Raises RealLedgerRefused unless this ledger is the demo's or holds no data, in `conn`'s transaction.

    The check holds until the caller commits: SQLite's `BEGIN IMMEDIATE` keeps every other
    writer out, and on PostgreSQL a lock that lets readers in keeps out writers of these tables
    and other seeders, so no real row can arrive between the check and the mark.
    """
    if conn.dialect.name == "postgresql":
        names = ", ".join(t.name for t in (*REAL_DATA, demo_seed))
        conn.exec_driver_sql(f"LOCK TABLE {names} IN SHARE ROW EXCLUSIVE MODE")
    if conn.execute(select(demo_seed.c.singleton)).first() is not None:
        return
    held = [
        t.name
        for t in REAL_DATA
        if conn.execute(select(literal(1)).select_from(t).limit(1)).first() is not None
    ]
    if held:
        raise RealLedgerRefused(
            f"this ledger holds {', '.join(held)} rows and no demo mark: it is a real shop's; "
            "seed an empty ledger (a new DIGEST_DATABASE_URL) instead"
        )


def mark_demo_data(conn: Connection, now: datetime) -> None:
    """Records, in the caller's transaction, that this ledger holds demo data (once)."""
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    conn.execute(
        dialect.insert(demo_seed).values(singleton=1, seeded_at=now).on_conflict_do_nothing()
    )


def holds_demo_data(engine: Engine) -> bool:
    """Whether `digest seed` ever wrote demo data into this ledger."""
    with engine.connect() as conn:
        return conn.execute(select(demo_seed.c.singleton)).first() is not None
