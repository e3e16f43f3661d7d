"""A refused week reads as refused: the reason on the run and the partition, no check failed.

Dagster resolves a check that a run planned but never evaluated as `EXECUTION_FAILED` when the
run failed and `SKIPPED` when it did not; these tests ask Dagster's own resolution.
"""

import asyncio
from datetime import timedelta

import dagster as dg

from digest_pipeline.component.guards import REFUSED_TAG
from digest_pipeline.component.late_grant import DELIVER_LATE_TAG, OPERATOR_TAG
from digest_pipeline.dagster_private import (
    AssetCheckExecutionResolvedStatus,
    LoadingContextForTest,
)
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.services.period_gate import LATE_ACTION
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.dagster.harness import (
    ASSETS,
    CHECKS,
    DELIVERY_AND_CLEANUP,
    PARTITION,
    World,
)

CLOSED = DeliveryPolicy().closes_at(W42) + timedelta(minutes=1)


def resolved_checks(instance: dg.DagsterInstance, run_id: str) -> dict[str, str]:
    """Each check the run planned, by name, as Dagster resolves its status for the UI."""
    context = LoadingContextForTest(instance)
    found = {}
    for definition in (*ASSETS, *CHECKS):
        for key in definition.check_keys:
            for record in instance.event_log_storage.get_asset_check_execution_history(key, 10):
                if record.run_id == run_id:
                    status = asyncio.run(record.resolve_status(context))
                    found[key.name] = status.value
    return found


def materialize_tagged(world: World, tags: dict[str, str]) -> dg.ExecuteInProcessResult:
    """The whole week, as a run launched with `tags` (the launchpad's or a backfill's)."""
    return dg.materialize(
        [*ASSETS, *CHECKS],
        partition_key=PARTITION,
        resources=world.resources(),
        instance=world.instance,
        tags=tags,
        raise_on_error=False,
    )


def test_a_missed_week_is_refused_with_its_reason_and_no_check_reads_as_failed(world_of):
    world = world_of(3)
    world.clock.set(CLOSED)

    result = world.materialize(raise_on_error=False)

    # nothing recorded, nothing sent, nothing materialised
    assert world.ledger.snapshot(W42) is None
    assert world.mailer.sends == 0
    assert result.get_asset_materialization_events() == []
    # the reason: on the run, and on the snapshot's partition
    run = world.instance.get_run_by_id(result.run_id)
    assert run is not None
    line = run.tags[REFUSED_TAG]
    assert "2026-W42" in line
    assert "--deliver-late --reason TEXT" in line
    [observation] = result.get_asset_observation_events()
    seen = observation.asset_observation_data.asset_observation
    assert seen.asset_key == dg.AssetKey("eligibility_snapshot")
    assert seen.partition == PARTITION
    assert seen.metadata["refused"].value == line
    # no check failed, nor failed to execute: each is skipped
    statuses = resolved_checks(world.instance, result.run_id)
    assert statuses, "the run planned the week's checks"
    assert set(statuses.values()) == {AssetCheckExecutionResolvedStatus.SKIPPED.value}


def test_a_sweeper_run_of_a_missed_week_is_refused_at_its_first_step(world_of):
    world = world_of(3)
    world.materialize(selection=["eligibility_snapshot", "digest_content", "digest_work_items"])
    world.clock.set(CLOSED)

    result = world.materialize(selection=DELIVERY_AND_CLEANUP, raise_on_error=False)

    assert result.success
    assert world.mailer.sends == 0
    assert result.get_asset_materialization_events() == []
    run = world.instance.get_run_by_id(result.run_id)
    assert run is not None
    assert "recorded and kept" in run.tags[REFUSED_TAG]
    [observation] = result.get_asset_observation_events()
    assert observation.asset_key == dg.AssetKey("digest_deliveries")
    statuses = resolved_checks(world.instance, result.run_id)
    assert AssetCheckExecutionResolvedStatus.EXECUTION_FAILED.value not in statuses.values()
    assert AssetCheckExecutionResolvedStatus.FAILED.value not in statuses.values()


def test_a_run_tagged_for_a_late_window_grants_it_audited_with_the_run_id(world_of):
    world = world_of(3)
    world.clock.set(CLOSED)

    result = materialize_tagged(
        world, {DELIVER_LATE_TAG: "provider outage on Monday", OPERATOR_TAG: "alice"}
    )

    assert result.success
    assert world.mailer.sends == 3
    [grant] = [e for e in world.ledger.audit_log(W42) if e.action == LATE_ACTION]
    assert grant.actor == "alice"
    assert grant.reason == f"provider outage on Monday (Dagster run {result.run_id})"


def test_a_late_tag_without_an_operator_refuses_the_week_and_grants_nothing(world_of):
    world = world_of(3)
    world.clock.set(CLOSED)

    result = materialize_tagged(world, {DELIVER_LATE_TAG: "provider outage"})

    assert world.mailer.sends == 0
    assert world.ledger.audit_log(W42) == []
    run = world.instance.get_run_by_id(result.run_id)
    assert run is not None
    assert OPERATOR_TAG in run.tags[REFUSED_TAG]


def test_a_late_tag_on_a_week_whose_window_is_open_records_no_grant(world_of):
    world = world_of(3)

    result = materialize_tagged(world, {DELIVER_LATE_TAG: "just in case", OPERATOR_TAG: "bob"})

    assert result.success
    assert world.mailer.sends == 3
    assert world.ledger.audit_log(W42) == []
