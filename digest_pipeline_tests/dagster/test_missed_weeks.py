"""A week that must not look green: a missed week in a UI run, and a delivery that attempted nothing."""

from datetime import datetime, timedelta

from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.dagster.harness import checks
from digest_pipeline_tests.fakes import FakeLedger


def test_a_full_run_of_a_missed_week_fails_at_the_snapshot_and_freezes_nothing(world_of):
    world = world_of(3)
    world.clock.set(DeliveryPolicy().closes_at(W42) + timedelta(minutes=1))

    result = world.materialize(raise_on_error=False)

    assert not result.success
    [failure] = [e for e in result.all_events if e.is_step_failure]
    assert failure.step_key == "eligibility_snapshot"
    assert "--deliver-late --reason TEXT" in failure.step_failure_data.error.message
    assert world.ledger.snapshot(W42) is None
    assert world.mailer.sends == 0


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
