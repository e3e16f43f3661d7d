"""A fresh ledger database per grid cell: a temporary SQLite file, or a scratch PostgreSQL.

The SQLite file goes to /dev/shm when the machine has it: every ledger transaction commits, and
on a disk the fsyncs, not the services, would set the pace of a simulation. A PostgreSQL
database given with `--database-url` must be empty at the start, because every cell truncates
its tables; it is left empty at the end.
"""

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from digest_pipeline.adapters.sql.schema import metadata
from digest_pipeline.rigs.bootstrap import open_rig_ledger
from digest_pipeline.rigs.sim.config import InvalidSimulation

MEMORY_DIR = Path("/dev/shm")


def check_database_url(url: str) -> None:
    """Only PostgreSQL is accepted; the default (no URL) is a temporary SQLite file."""
    try:
        backend = make_url(url).get_backend_name()
    except ArgumentError as e:
        raise InvalidSimulation(f"--database-url is not a database URL: {e}") from e
    if backend != "postgresql":
        raise InvalidSimulation(
            "--database-url must be a postgresql:// URL (without it, each cell uses a "
            "temporary SQLite file)"
        )


def _truncate(engine: Engine) -> None:
    names = ", ".join(t.name for t in metadata.sorted_tables)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))


def require_empty(url: str) -> None:
    """Refuses a PostgreSQL database that holds any ledger or shop rows."""
    with open_rig_ledger(url, pool_size=1) as ledger, ledger.engine.connect() as conn:
        used = [
            t.name
            for t in metadata.sorted_tables
            if conn.execute(select(text("1")).select_from(t).limit(1)).first() is not None
        ]
    if used:
        raise InvalidSimulation(
            f"--database-url holds data (table {used[0]}); the simulator truncates every "
            "table between cells, so give it an empty scratch database"
        )


@contextmanager
def scratch_engine(database_url: str | None) -> Iterator[Engine]:
    """A migrated, empty ledger engine for one cell; the SQLite file is deleted afterwards."""
    if database_url is not None:
        with open_rig_ledger(database_url) as ledger:
            _truncate(ledger.engine)
            yield ledger.engine
            _truncate(ledger.engine)
        return
    base = MEMORY_DIR if MEMORY_DIR.is_dir() and os.access(MEMORY_DIR, os.W_OK) else None
    with (
        tempfile.TemporaryDirectory(prefix="digest-simulate-", dir=base) as folder,
        open_rig_ledger(f"sqlite:///{Path(folder) / 'ledger.db'}") as ledger,
    ):
        yield ledger.engine
