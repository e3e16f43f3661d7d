"""The ledger's identity (a random id and its digest instance, both in the ledger) and a safe URL.

A run records the id and URL, so any later process can tell whether it opened the same ledger;
the shown URL never carries a password. The instance is recorded by the first process that opens
the ledger under an instance's name, and every later process checks its own name against it, so
a ledger's keys are only ever one instance's, whatever the environment of the next process says.
"""

import uuid
from datetime import datetime
from pathlib import Path

from sqlalchemy import ColumnElement, Connection, Engine, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url

from digest_pipeline.adapters.sql.schema import ledger_identity, period_runs, work_items
from digest_pipeline.domain.errors import LedgerMismatch
from digest_pipeline.domain.periods import DEFAULT_INSTANCE, validate_instance_name


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


def _holds_work() -> ColumnElement[bool]:
    """Whether the ledger holds a work item or a frozen period: keys of some instance exist."""
    return or_(select(work_items.c.operation_key).exists(), select(period_runs.c.period).exists())


def _recorded(conn: Connection) -> str | None:
    """The stored instance, else `digest` for a ledger that holds work, else None.

    A ledger that holds work and names no instance was made before instances existed, so every
    key it holds is `digest:…`.
    """
    stored = conn.execute(select(ledger_identity.c.instance)).scalar_one_or_none()
    if stored is not None:
        return str(stored)
    return DEFAULT_INSTANCE if conn.execute(select(_holds_work())).scalar() else None


def claim_instance(engine: Engine, name: str, now: datetime) -> None:
    """Records `name` as the ledger's digest instance, or checks it against the one it has.

    A ledger that holds no work and names no instance takes `name` (its identity row is made as
    `ledger_id` makes it, if it has none); one that holds work and names none is `digest`'s and
    stays as it is. The check and the record are one transaction, so of two processes opening a
    new ledger under different names one records its name and the other is refused.

    Raises:
        LedgerMismatch: the ledger is another instance's; nothing was changed.
        InvalidInstanceName: `name` is not an instance's name.
    """
    validate_instance_name(name)
    with engine.begin() as conn:
        found = _recorded(conn)
        if found is None:
            _record(conn, name, now)
            # read back: a concurrent first open that committed first keeps its name
            found = _recorded(conn)
        if found != name:
            raise LedgerMismatch(_mismatch(engine, found, name))


def _record(conn: Connection, name: str, now: datetime) -> None:
    """Writes `name` into an empty ledger's identity row, unless another write got there first."""
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    if conn.execute(select(ledger_identity.c.singleton)).first() is None:
        row = {"singleton": 1, "ledger_id": str(uuid.uuid4()), "created_at": now, "instance": name}
        conn.execute(dialect.insert(ledger_identity).values(row).on_conflict_do_nothing())
        return
    conn.execute(
        update(ledger_identity)
        .where(ledger_identity.c.instance.is_(None), ~_holds_work())
        .values(instance=name)
    )


def recorded_instance(engine: Engine) -> str | None:
    """The ledger's digest instance (read only, as `claim_instance` reads it); None: not yet any."""
    with engine.connect() as conn:
        return _recorded(conn)


def _mismatch(engine: Engine, found: str | None, name: str) -> str:
    url = shown_url(engine.url.render_as_string(hide_password=False))
    return (
        f"the ledger at {url} belongs to digest instance {found}, not {name}: open it as "
        f"{found} (DIGEST_INSTANCE={found}) or give {name} a ledger database of its own"
    )


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
