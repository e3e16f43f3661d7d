"""A week that must not look green: a delivery that attempted nothing (test_refused_weeks.py has\nthe missed week)."""

from datetime import datetime

from digest_pipeline.domain.states import DeliveryState
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.dagster.harness import checks
from digest_pipeline_tests.fakes import FakeLedger


class BatchesNeverRun(FakeLedger):
    """Counts nothing due, as if the executor had dropped the delivery fan-out."""

    def due_count(self, now: datetime, period: object = None) -> int:
        return 0


def test_a_delivery_step_that_attempted_nothing_fails_the_run_and_blocks_cleanup(world_of):
    world = world_of(4)
    world.ledger = BatchesNeverRun()

    result = world.materialize(raise_on_error=False)

    evaluation = checks(result)["every_due_item_attempted"]
    assert not evaluation.passed
    assert evaluation.metadata["violations"].value == 4
    assert "never attempted" in (evaluation.description or "")
    assert not result.success
    assert result.asset_materializations_for_node("digest_cleanup") == []
    assert world.ledger.state_counts(W42) == {DeliveryState.PENDING: 4}


def test_a_delivered_week_passes_the_attempted_check(world_of):
    result = world_of(4).materialize()
    assert checks(result)["every_due_item_attempted"].passed
