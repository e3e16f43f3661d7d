"""Step outputs in the ledger: what a step on another machine reads is what its upstream wrote."""

from collections.abc import Callable
from datetime import timedelta

import pytest
from sqlalchemy import Engine

from digest_pipeline.adapters.sql.step_outputs import OutputAddress, SqlStepOutputs, StepOutputError
from digest_pipeline_tests.conftest import SQL_BACKENDS, T0

PLAN = OutputAddress("run-1", "digest_deliveries.plan_batches", "before")
BATCH = OutputAddress("run-1", "digest_deliveries.plan_batches", "batches", "batch_0001")


@pytest.fixture(params=SQL_BACKENDS)
def store(request: pytest.FixtureRequest, sql_engine_factory: Callable[[str], Engine]):
    return SqlStepOutputs(sql_engine_factory(request.param))


def test_each_output_reads_back_as_written_and_mapped_outputs_are_kept_apart(store):
    store.put(PLAN, {"batches": 2, "lease_requeued": 0}, T0)
    store.put(BATCH, 1, T0)
    store.put(OutputAddress(BATCH.run_id, BATCH.step_key, BATCH.output_name, "batch_0000"), 0, T0)
    assert store.get(PLAN) == {"batches": 2, "lease_requeued": 0}
    assert store.get(BATCH) == 1


def test_a_retried_step_replaces_its_output(store):
    store.put(PLAN, {"batches": 1}, T0)
    store.put(PLAN, {"batches": 3}, T0 + timedelta(seconds=5))
    assert store.get(PLAN) == {"batches": 3}


def test_a_value_that_is_not_json_is_refused_and_nothing_is_stored(store):
    with pytest.raises(StepOutputError, match="not a JSON value"):
        store.put(PLAN, {"at": T0}, T0)
    with pytest.raises(StepOutputError, match="is not in the ledger"):
        store.get(PLAN)


def test_another_runs_output_is_not_read_and_the_line_says_what_to_do(store):
    store.put(PLAN, {"batches": 1}, T0)
    with pytest.raises(StepOutputError, match="re-execute the run from its first step"):
        store.get(OutputAddress("run-2", PLAN.step_key, PLAN.output_name))


def test_pruning_removes_only_outputs_older_than_the_cut_off(store):
    store.put(PLAN, {"batches": 1}, T0 - timedelta(days=20))
    store.put(BATCH, 1, T0)
    assert store.prune(T0 - timedelta(days=14)) == 1
    assert store.get(BATCH) == 1
    with pytest.raises(StepOutputError):
        store.get(PLAN)
