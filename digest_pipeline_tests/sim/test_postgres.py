"""`--database-url`: the simulator on PostgreSQL gives the same numbers as on SQLite, truncates
only a scratch database between cells, and refuses one that holds data."""

import pytest
from pandas.testing import assert_frame_equal
from sqlalchemy import Engine, func, insert, select

from digest_pipeline.adapters.sql.schema import customers, work_items
from digest_pipeline.rigs.sim.config import START, InvalidSimulation, SimConfig
from digest_pipeline.rigs.sim.grid import run_grid
from digest_pipeline_tests.conftest import truncate_pg

pytestmark = pytest.mark.integration
GRID = SimConfig(customers=80, workers=(1, 3), lease_seconds=(5, 60))


def url_of(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def test_the_same_seed_gives_the_same_frame_on_postgresql_as_on_sqlite(pg_engine):
    truncate_pg(pg_engine)
    on_postgres = run_grid(GRID, database_url=url_of(pg_engine))
    assert on_postgres.ok
    assert_frame_equal(on_postgres.frame, run_grid(GRID).frame)
    with pg_engine.connect() as conn:  # left empty for the next run
        assert conn.execute(select(func.count()).select_from(work_items)).scalar_one() == 0


def test_a_database_that_holds_data_is_refused_untouched(pg_engine):
    truncate_pg(pg_engine)
    with pg_engine.begin() as conn:
        conn.execute(
            insert(customers).values(
                customer_id="c1",
                email="c1@example.com",
                active=True,
                opted_in=True,
                created_at=START,
            )
        )
    with pytest.raises(InvalidSimulation, match="holds data"):
        run_grid(GRID, database_url=url_of(pg_engine))
    with pg_engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(customers)).scalar_one() == 1
    truncate_pg(pg_engine)
