"""The weekly schedule and the retry sweeper, evaluated with Dagster's testing helpers."""

from datetime import UTC, date, datetime, timedelta

import dagster as dg
import pytest

from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import Transition
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.services.late import grant_late_delivery
from digest_pipeline_tests.builders import complete_one, key_of, seed_period, start_one
from digest_pipeline_tests.conftest import T0, W42
from digest_pipeline_tests.dagster.harness import (
    BEFORE_DELIVERY,
    PARTITION,
    World,
    metadata,
    project,
    sweep,
)

SWEEP_KEYS = [dg.AssetKey("digest_deliveries"), dg.AssetKey("digest_cleanup")]


@pytest.fixture(scope="module")
def schedule() -> dg.ScheduleDefinition:
    return project().resolve_schedule_def("weekly_digest_schedule")


@pytest.mark.parametrize(
    ("tick", "partition", "period"),
    [
        (datetime(2026, 10, 19, 6, 0, tzinfo=UTC), "2026-10-12", "2026-W42"),
        (datetime(2026, 1, 5, 6, 0, tzinfo=UTC), "2025-12-29", "2026-W01"),
    ],
)
def test_a_monday_tick_requests_the_week_that_just_ended(schedule, tick, partition, period):
    data = schedule.evaluate_tick(dg.build_schedule_context(scheduled_execution_time=tick))

    [request] = data.run_requests
    assert (request.partition_key, request.run_key) == (partition, partition)
    assert str(Period.parse(request.partition_key)) == period


def test_the_schedule_runs_the_weekly_job_on_monday_morning_and_starts_stopped(schedule):
    assert schedule.job_name == "weekly_digest_job"
    assert (schedule.cron_schedule, schedule.execution_timezone) == ("0 6 * * 1", "UTC")
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED


def run_requested(world: World, request: dg.RunRequest) -> dg.ExecuteInProcessResult:
    """Executes a sweeper request as the daemon would: its partition, its assets."""
    assert request.asset_selection == SWEEP_KEYS
    assert request.partition_key == PARTITION
    return world.materialize(selection=[k.to_user_string() for k in request.asset_selection])


def test_the_sweeper_skips_when_no_week_is_open(world_of):
    world = world_of(3)
    assert sweep(world).skip_message
    world.materialize()
    assert "no open week" in sweep(world).skip_message


def test_a_due_retry_gets_one_run_whose_key_changes_only_with_the_due_batch(world_of):
    world = world_of(3)
    world.mailer.script(key_of(1), SendOutcome.failed(FailureClass.TRANSIENT, "smtp:451"))
    world.mailer.script(key_of(1), SendOutcome.failed(FailureClass.TRANSIENT, "smtp:451"))
    world.materialize()
    assert sweep(world).skip_message  # the retry is not due yet

    world.clock.advance(timedelta(hours=2))
    [first] = sweep(world).run_requests
    assert first.run_key.startswith("sweep:2026-W42:")
    assert first.tags["digest/trigger"] == "sweep"
    world.clock.advance(timedelta(minutes=5))
    assert [r.run_key for r in sweep(world).run_requests] == [first.run_key]

    run_requested(world, first)  # fails again: a new retry, a new lease token
    world.clock.advance(timedelta(hours=2))
    [second] = sweep(world).run_requests
    assert second.run_key != first.run_key

    result = run_requested(world, second)
    assert metadata(result, "digest_deliveries")["sent_this_run"] == 1
    assert metadata(result, "digest_cleanup")["cleaned"] == 1
    assert "no open week" in sweep(world).skip_message


def test_unknown_items_and_expired_claims_are_swept(world_of):
    world = world_of(3)
    world.materialize(selection=BEFORE_DELIVERY)
    ledger, lease = world.ledger, DeliveryPolicy().lease
    [c1, _] = ledger.claim_due(T0, "crashed-worker", lease, 2, W42)
    ticket = start_one(ledger, c1, T0)
    complete_one(
        ledger,
        ticket,
        SendOutcome.failed(FailureClass.UNKNOWN, "timeout_after_send"),
        Transition(
            c1.key,
            DeliveryState.CLAIMED,
            c1.token,
            DeliveryState.UNKNOWN,
            T0,
            failure_class=FailureClass.UNKNOWN,
        ),
    )
    world.ledger.claim_due(T0, "busy-worker", lease, 1, W42)  # customer 3: claimed, lease live
    [only_unknown] = sweep(world).run_requests

    world.clock.advance(lease + timedelta(seconds=1))  # customers 2 and 3 now hold dead claims
    [with_expired] = sweep(world).run_requests
    assert with_expired.run_key != only_unknown.run_key

    result = run_requested(world, with_expired)
    deliveries = metadata(result, "digest_deliveries")
    assert (deliveries["lease_requeued"], deliveries["sent_this_run"]) == (2, 2)
    # the provider never saw customer 1's key: reconciliation makes it due again, unsent
    assert deliveries["reconciled"] == 1
    assert [ledger.get(key_of(n)).state for n in (1, 2, 3)] == [
        DeliveryState.RETRY_SCHEDULED,
        DeliveryState.CLEANED,
        DeliveryState.CLEANED,
    ]
    [retry] = sweep(world).run_requests
    run_requested(world, retry)
    assert ledger.get(key_of(1)).state is DeliveryState.CLEANED
    assert world.mailer.deliveries_for(key_of(1)) == 1


def test_a_missed_week_fails_its_sweep_run_visibly_and_records_nothing(world_of):
    world = world_of(3)
    world.materialize(selection=BEFORE_DELIVERY)
    world.clock.set(DeliveryPolicy().closes_at(W42) + timedelta(hours=1))
    before = world.ledger.state_counts(W42)

    [request] = sweep(world).run_requests
    result = world.materialize(
        selection=[k.to_user_string() for k in request.asset_selection], raise_on_error=False
    )

    assert not result.success
    [failure] = [e for e in result.all_events if e.is_step_failure]
    assert "before any digest was attempted" in failure.step_failure_data.error.message
    assert "--deliver-late" in failure.step_failure_data.error.message
    assert world.mailer.sends == 0
    assert world.ledger.state_counts(W42) == before
    assert world.ledger.dead_letters(W42) == []


def test_a_late_grant_lets_the_sweeper_deliver_a_missed_week(world_of):
    world = world_of(3)
    world.materialize(selection=BEFORE_DELIVERY)
    world.clock.set(DeliveryPolicy().closes_at(W42) + timedelta(hours=1))
    grant_late_delivery(
        world.ledger, DeliveryPolicy(), W42, world.clock.now(), "ops", "provider outage"
    )

    [request] = sweep(world).run_requests
    run_requested(world, request)

    assert world.mailer.sends == 3
    assert world.ledger.state_counts(W42) == {DeliveryState.CLEANED: 3}
    assert "no open week" in sweep(world).skip_message


def test_weeks_that_are_not_partitions_are_skipped(world_of):
    world = world_of(0)
    seed_period(world.ledger, 2, period=Period(2024, 50))  # before the first partition
    seed_period(world.ledger, 2, period=Period.of(datetime.now(UTC).date()))  # in progress
    assert Period.of(date(2024, 12, 9)) == Period(2024, 50)

    assert "no open week" in sweep(world).skip_message
