"""`digest seed` marks its ledger as the demo's; nothing else does (`adapters/sql/demo_marker.py`)."""

import pytest

from digest_pipeline.adapters.demo_data import seed_demo
from digest_pipeline.adapters.sql.demo_marker import holds_demo_data
from digest_pipeline_tests.builders import seed_period
from digest_pipeline_tests.conftest import SQL_BACKENDS, T0


@pytest.fixture(params=SQL_BACKENDS)
def engine(request, sql_engine_factory):
    return sql_engine_factory(request.param)


def test_a_fresh_or_hand_seeded_ledger_holds_no_demo_data(engine, sql_ledger):
    assert not holds_demo_data(engine)
    seed_period(sql_ledger, 3)  # the rigs' and tests' numbered customers are not `digest seed`
    assert not holds_demo_data(sql_ledger.engine)


def test_seeding_the_demo_marks_the_ledger_once_however_often_it_runs(engine):
    seed_demo(engine, customers=4, seed=1, now=T0)
    seed_demo(engine, customers=6, seed=1, now=T0)
    assert holds_demo_data(engine)
