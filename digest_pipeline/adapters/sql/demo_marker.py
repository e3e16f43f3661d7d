"""The mark `digest seed` leaves in a ledger, so the demo's public secret works only on the demo.

`seed_demo` writes one `demo_seed` row in the transaction that inserts the demo shop; `digest run`
and `digest serve` read it to decide whether the public `DIGEST_UNSUBSCRIBE_SECRET` default may
be used (`domain.unsubscribe.public_secret_refusal`). A ledger of real customers never has it.
"""

from datetime import datetime

from sqlalchemy import Connection, Engine, select
from sqlalchemy.dialects import postgresql, sqlite

from digest_pipeline.adapters.sql.schema import demo_seed


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
