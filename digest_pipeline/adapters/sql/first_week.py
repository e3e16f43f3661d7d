"""The earliest week a ledger holds, read without creating, migrating or locking anything.

The code location asks once, when its definitions load, so its weekly partitions start at the
install's first week: one statement on a connection of its own, closed straight after.
"""

from pathlib import Path
from urllib.parse import quote

from sqlalchemy import Engine, create_engine, func, select, union_all
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import NullPool

from digest_pipeline.adapters.sql.engine import LedgerDatabaseError, guard_engine_errors
from digest_pipeline.adapters.sql.schema import period_runs, work_items
from digest_pipeline.domain.errors import DigestError, InvalidPeriod
from digest_pipeline.domain.periods import Period

#: seconds to wait for a PostgreSQL connection or a SQLite lock: an unreachable ledger must not
#: hold up loading the code location for the minutes a TCP connect can take
TIMEOUT_S = 5
#: PostgreSQL's undefined_table: the database exists, but no command has migrated it yet
_UNDEFINED_TABLE = "42P01"
_FIRST = union_all(
    select(func.min(period_runs.c.period).label("period")),
    select(func.min(work_items.c.period).label("period")),
).subquery()
#: the earliest frozen snapshot or work item; both columns lead an index, so it reads two keys
EARLIEST = select(func.min(_FIRST.c.period))


class LedgerUnreadable(DigestError):
    """The ledger's earliest week could not be read; the message is one line, safe to log."""


def _read_only_engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        args: dict[str, object] = {"connect_timeout": TIMEOUT_S}
    else:
        args = {"timeout": TIMEOUT_S}
        if parsed.query.get("uri") is None:
            # SQLite's read-only mode: a missing file fails to open instead of being created
            path = Path(parsed.database or "").absolute().as_posix()
            parsed = parsed.set(
                database=f"file:{quote(path)}", query={**parsed.query, "mode": "ro", "uri": "true"}
            )
    # NullPool: the one connection is closed on return, not kept for a load that never comes
    engine = create_engine(parsed, poolclass=NullPool, connect_args=args, hide_parameters=True)
    return guard_engine_errors(engine)


def _no_tables_yet(error: LedgerDatabaseError) -> bool:
    """The database exists but holds no ledger tables (nothing has migrated it)."""
    orig = error.orig
    code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return code == _UNDEFINED_TABLE or str(orig).startswith("no such table")


def earliest_period(url: str) -> Period | None:
    """The earliest period with a frozen snapshot or a work item in the ledger at `url`.

    None when the ledger holds neither, or does not exist yet: a missing SQLite file or a
    database without the ledger's tables (neither is created). Raises LedgerUnreadable when the
    database cannot be reached or read; its line never repeats the URL, which may hold a password.
    """
    try:
        parsed = make_url(url)
        sqlite_file = parsed.get_backend_name() == "sqlite" and parsed.query.get("uri") is None
        if sqlite_file and not Path(parsed.database or "").is_file():
            return None
        engine = _read_only_engine(url)
    except (ArgumentError, ValueError, ImportError) as e:
        raise LedgerUnreadable(f"the ledger's URL cannot be opened ({type(e).__name__})") from e
    try:
        with engine.connect() as conn:
            first = conn.execute(EARLIEST).scalar()
    except LedgerDatabaseError as e:
        if _no_tables_yet(e):
            return None
        raise LedgerUnreadable(str(e)) from e
    finally:
        engine.dispose()
    try:
        return None if first is None else Period.parse(str(first))
    except InvalidPeriod as e:
        raise LedgerUnreadable(f"the ledger's earliest period: {e}") from e
