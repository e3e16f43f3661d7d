"""Small simulations for the simulator's own tests: 200 customers, one or two cells, no faults
unless a test names them, so each number a test asserts on has one cause."""

from dataclasses import replace
from datetime import timedelta
from typing import Any

from digest_pipeline.rigs.sim.config import Cell, FaultMix, SimConfig
from digest_pipeline.rigs.sim.engine import run_cell
from digest_pipeline.rigs.sim.measure import CellResult

N = 200
#: no failures, no outage, no crashes: the baseline every test adds one fault to
QUIET = FaultMix(
    transient_rate=0.0,
    throttle_rate=0.0,
    permanent_rate=0.0,
    timeout_after_accept_rate=0.0,
    crash_after_send_rate=0.0,
    crash_after_cleanup_commit_rate=0.0,
    duplicate_delivery_rate=0.0,
    outage_length=timedelta(0),
)


def config(customers: int = N, **faults: Any) -> SimConfig:
    """One cell (4 workers, 30 s lease) over QUIET plus the named faults."""
    return SimConfig(
        customers=customers, faults=replace(QUIET, **faults), workers=(4,), lease_seconds=(30,)
    )


def cell(workers: int = 4, lease_seconds: int = 30, *, jitter: bool = True) -> Cell:
    return Cell(no_jitter=not jitter, workers=workers, lease_seconds=lease_seconds)


def simulate(cfg: SimConfig, the_cell: Cell | None = None, **kwargs: Any) -> CellResult:
    return run_cell(cfg, the_cell or cell(), **kwargs)


def row_of(cfg: SimConfig, the_cell: Cell | None = None, **kwargs: Any) -> dict[str, Any]:
    """The cell's row, typed loosely so tests can compare its numbers."""
    return simulate(cfg, the_cell, **kwargs).row
