"""An instance's I/O manager: step outputs live in the run's ledger, not on a disk.

Dagster's default I/O manager pickles every output into the launching instance's storage folder,
which a step on a Celery worker or a Kubernetes pod (another machine, its own disk) cannot read.
The values this graph passes are a few small JSON documents per run (the fan-out's batch
numbers and counts), so they are kept in the ledger database every step already opens, through
the same fail-closed check as the ledger itself. Rows older than `RETENTION` are pruned when a
run writes; until then, "re-execute from failure" reads its parent run's outputs.
"""

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import dagster as dg
from pydantic import Field, PrivateAttr
from sqlalchemy import Engine

from digest_pipeline.adapters.clock import SystemClock
from digest_pipeline.adapters.sql.step_outputs import OutputAddress, SqlStepOutputs
from digest_pipeline.component.resources import open_ledger_engine

#: how long a run's outputs stay readable by its re-executions
RETENTION = timedelta(days=14)


def _address(context: dg.OutputContext) -> OutputAddress:
    # `run_id` is the parent run's for a step a re-execution skipped (Dagster resolves it)
    return OutputAddress(context.run_id, context.step_key, context.name, context.mapping_key or "")


class _LedgerOutputs(dg.IOManager):
    """Opens the ledger at the first output it keeps or input it loads.

    A step of another instance in the same code location may require this key for outputs that
    hold nothing (an asset check's): such a step never opens, nor records on its run, this
    instance's ledger.
    """

    def __init__(self, open_store: Callable[[], SqlStepOutputs]) -> None:
        self._open_store = open_store
        self._store: SqlStepOutputs | None = None
        self._pruned = False

    def _opened(self) -> SqlStepOutputs:
        if self._store is None:
            self._store = self._open_store()
        return self._store

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        store, now = self._opened(), SystemClock().now()
        if not self._pruned:
            store.prune(now - RETENTION)
            self._pruned = True
        store.put(_address(context), obj, now)

    def load_input(self, context: dg.InputContext) -> Any:
        upstream = context.upstream_output
        assert upstream is not None, "every input of this graph comes from a step output"
        return self._opened().get(_address(upstream))


class LedgerIOManager(dg.ConfigurableIOManagerFactory[dg.IOManager]):
    """Keeps step outputs in the instance's ledger database (`DIGEST_DATABASE_URL`), as JSON."""

    #: the instance's `DIGEST_*` values, laid over the environment
    instance_settings: dict[str, str] = Field(default_factory=dict)
    database_url: str | None = None
    _engine: Engine | None = PrivateAttr(default=None)

    def create_io_manager(self, context: dg.InitResourceContext) -> dg.IOManager:
        def open_store() -> SqlStepOutputs:
            self._engine = open_ledger_engine(context, self.instance_settings, self.database_url)
            return SqlStepOutputs(self._engine)

        return _LedgerOutputs(open_store)

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._engine is not None:
            self._engine.dispose()
