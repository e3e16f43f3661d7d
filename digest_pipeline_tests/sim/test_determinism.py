"""One seed, one result: the same inputs give the same frame and the same bytes, whichever number
of processes ran the cells; another seed gives other numbers."""

from pandas.testing import assert_frame_equal

from digest_pipeline.rigs.sim.config import SimConfig
from digest_pipeline.rigs.sim.grid import run_grid
from digest_pipeline.rigs.sim.measure import COLUMNS
from digest_pipeline.rigs.sim.report import render_table

#: the default failure mix (every fault on) over a small grid
GRID = SimConfig(customers=150, workers=(1, 4), lease_seconds=(5, 60))


def test_a_fixed_seed_gives_identical_frames_and_tables_twice():
    first, again = run_grid(GRID), run_grid(GRID)
    assert_frame_equal(first.frame, again.frame)
    assert render_table(first.frame) == render_table(again.frame)


def test_the_frame_has_one_row_per_cell_in_a_stable_column_order():
    frame = run_grid(GRID).frame
    assert list(frame.columns) == list(COLUMNS)
    assert list(frame["cell"]) == ["w1/l5", "w1/l60", "w4/l5", "w4/l60"]


def test_another_seed_gives_other_numbers():
    one = run_grid(GRID).frame
    other = run_grid(SimConfig(customers=150, seed=8, workers=(1, 4), lease_seconds=(5, 60))).frame
    assert not one.equals(other)


def test_cells_run_in_parallel_processes_give_the_same_frame():
    small = SimConfig(customers=60, workers=(1, 2), lease_seconds=(5,))
    assert_frame_equal(run_grid(small, jobs=2).frame, run_grid(small, jobs=1).frame)
