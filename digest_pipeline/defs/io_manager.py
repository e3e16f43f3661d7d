"""The code location's I/O manager: step outputs live in the run's ledger, not on a disk.

Dagster's default I/O manager pickles every output into the launching instance's storage folder,
which a step on a Celery worker or a Kubernetes pod (another machine, its own disk) cannot read.
The values this graph passes are a few small JSON documents per run (the fan-out's batch
numbers and counts), so they are kept in the ledger database every step already opens, through
the same fail-closed check as the ledger itself. Rows older than `RETENTION` are pruned when a
run writes; until then, "re-execute from failure" reads its parent run's outputs.
"""

from datetime import timedelta
from typing import Any

import dagster as dg
from pydantic import PrivateAttr
from sqlalchemy import Engine

from digest_pipeline.adapters.clock import SystemClock
from digest_pipeline.adapters.sql.step_outputs import OutputAddress, SqlStepOutputs
from digest_pipeline.defs.resources import open_ledger_engine

#: how long a run's outputs stay readable by its re-executions
RETENTION = timedelta(days=14)


def _address(context: dg.OutputContext) -> OutputAddress:
    # `run_id` is the parent run's for a step a re-execution skipped (Dagster resolves it)
    return OutputAddress(context.run_id, context.step_key, context.name, context.mapping_key or "")


class _LedgerOutputs(dg.IOManager):
    def __init__(self, store: SqlStepOutputs) -> None:
        self._store = store
        self._pruned = False

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        now = SystemClock().now()
        if not self._pruned:
            self._store.prune(now - RETENTION)
            self._pruned = True
        self._store.put(_address(context), obj, now)

    def load_input(self, context: dg.InputContext) -> Any:
        upstream = context.upstream_output
        assert upstream is not None, "every input of this graph comes from a step output"
        return self._store.get(_address(upstream))


class LedgerIOManager(dg.ConfigurableIOManagerFactory[dg.IOManager]):
    """Keeps step outputs in the ledger database (`DIGEST_DATABASE_URL`), as JSON."""

    database_url: str | None = None
    _engine: Engine | None = PrivateAttr(default=None)

    def create_io_manager(self, context: dg.InitResourceContext) -> dg.IOManager:
        self._engine = open_ledger_engine(context, self.database_url)
        return _LedgerOutputs(SqlStepOutputs(self._engine))

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._engine is not None:
            self._engine.dispose()


@dg.definitions
def io_manager() -> dg.Definitions:
    """Binds `io_manager`, the key every op and asset output uses unless it names another."""
    return dg.Definitions(resources={"io_manager": LedgerIOManager()})
