"""The ledger's identity: a random id stored in the ledger itself, and a URL safe to show.

A run records both, so any later process can tell whether it opened the same ledger; the shown
URL never carries a password.
"""

import uuid
from datetime import datetime
from pathlib import Path

from sqlalchemy import Engine, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url

from digest_pipeline.adapters.sql.schema import ledger_identity


def ledger_id(engine: Engine, now: datetime) -> str:
    """The ledger's id, created on first use (one row; concurrent first uses agree)."""
    with engine.begin() as conn:
        found = conn.execute(select(ledger_identity.c.ledger_id)).scalar_one_or_none()
        if found is not None:
            return str(found)
        dialect = postgresql if engine.dialect.name == "postgresql" else sqlite
        conn.execute(
            dialect.insert(ledger_identity)
            .values(singleton=1, ledger_id=str(uuid.uuid4()), created_at=now)
            .on_conflict_do_nothing()
        )
        return str(conn.execute(select(ledger_identity.c.ledger_id)).scalar_one())


def stored_ledger_id(engine: Engine) -> str | None:
    """The ledger's id if it has one; never creates it (`ledger_id` does)."""
    with engine.connect() as conn:
        found = conn.execute(select(ledger_identity.c.ledger_id)).scalar_one_or_none()
    return None if found is None else str(found)


def shown_url(url: str) -> str:
    """The URL with its password masked, for run tags and error lines."""
    return make_url(url).render_as_string(hide_password=True)


def missing_sqlite_file(url: str) -> Path | None:
    """The SQLite file `url` names when it does not exist yet (opening it would create it)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    path = Path(parsed.database)
    return None if path.exists() else path
