"""The grid runner: every cell of a `SimConfig`, each on a fresh ledger, as one DataFrame.

Cells are independent and each is deterministic, so they may run in parallel processes (SQLite
only; PostgreSQL cells share one database and run one after another) and the frame is the same
whatever the number of processes: one row per cell, in `SimConfig.cells()` order, with the
columns of `measure.COLUMNS`.
"""

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial

import pandas as pd

from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.rigs.sim.config import InvalidSimulation, SimConfig
from digest_pipeline.rigs.sim.database import check_database_url, require_empty
from digest_pipeline.rigs.sim.engine import LedgerFactory, run_cell
from digest_pipeline.rigs.sim.measure import COLUMNS, CellResult


@dataclass(frozen=True)
class GridResult:
    """The cells' results and the same numbers as a DataFrame (one row per cell)."""

    frame: pd.DataFrame
    cells: tuple[CellResult, ...]

    @property
    def ok(self) -> bool:
        """Every design §4 invariant held in every cell."""
        return all(c.ok for c in self.cells)


def default_jobs(config: SimConfig, database_url: str | None) -> int:
    """One process per core, at most two (the machine class this runs on), for SQLite cells."""
    if database_url is not None:
        return 1
    return max(1, min(2, os.cpu_count() or 1, len(config.cells())))


def to_frame(results: list[CellResult]) -> pd.DataFrame:
    """The rows in the stable column order."""
    return pd.DataFrame([r.row for r in results], columns=list(COLUMNS))


def run_grid(
    config: SimConfig,
    *,
    jobs: int = 1,
    database_url: str | None = None,
    ledger_factory: LedgerFactory = SqlLedger,
) -> GridResult:
    """Runs every cell; `jobs` > 1 runs SQLite cells in that many processes."""
    if jobs < 1:
        raise InvalidSimulation("--jobs must be at least 1")
    cells = config.cells()
    if database_url is not None:
        if jobs > 1:
            raise InvalidSimulation("--jobs must be 1 with --database-url: the cells share it")
        check_database_url(database_url)
        require_empty(database_url)
    if jobs > 1 and ledger_factory is SqlLedger:
        # spawn, not fork: each process starts clean, with no scheduler threads inherited
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            results = list(pool.map(partial(run_cell, config), cells))
    else:
        run = partial(run_cell, database_url=database_url, ledger_factory=ledger_factory)
        results = [run(config, cell) for cell in cells]
    return GridResult(to_frame(results), tuple(results))
