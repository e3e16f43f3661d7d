"""One way for a rig or a benchmark to get a ledger ready: an engine, the migrations, a `SqlLedger`.

The simulator, the chaos harness, the Celery rig and the benchmarks all open their ledgers here,
and dispose of the engine when the `with` block ends, so none of them builds one its own way.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.wiring import migrated_engine

#: the checkout the rigs run from: `workspace.yaml`, `dagster.yaml` and `deploy/` live here
PROJECT_ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def open_rig_ledger(url: str, *, pool_size: int = 2) -> Iterator[SqlLedger]:
    """A `SqlLedger` on `url`, migrated to the newest schema; its engine is disposed afterwards.

    Args:
        url: the ledger's database URL (a SQLite file's folder is created if missing).
        pool_size: connections the engine keeps (and as many more on overflow).
    """
    engine = migrated_engine(url, pool_size=pool_size)
    try:
        # The default instance's, unrecorded: a rig's database is scratch (the simulator wants
        # it empty, then truncates it), and the processes a rig starts record it themselves.
        yield SqlLedger(engine)
    finally:
        engine.dispose()
