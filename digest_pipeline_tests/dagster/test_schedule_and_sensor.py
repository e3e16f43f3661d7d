"""The weekly schedule and the retry sweeper, evaluated with Dagster's testing helpers."""

from datetime import UTC, date, datetime, timedelta
from typing import Any

import dagster as dg
import pytest

from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import Transition
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.services.period_gate import grant_late_delivery
from digest_pipeline_tests.builders import complete_one, key_of, seed_period, start_one
from digest_pipeline_tests.conftest import T0, W42
from digest_pipeline_tests.dagster.graph import project
from digest_pipeline_tests.dagster.harness import (
    BEFORE_DELIVERY,
    PARTITION,
    World,
    metadata,
    refusal,
    sweep,
)

SWEEP_KEYS = [dg.AssetKey("digest_deliveries"), dg.AssetKey("digest_cleanup")]
JOB = "weekly_digest_job"
#: a delivery window that closes at 01:00 on the Monday after the week, before the 06:00 tick
HOUR_WINDOW = {"delivery_window_seconds": 3600}


@pytest.fixture(scope="module")
def schedule() -> dg.ScheduleDefinition:
    return project().resolve_schedule_def("weekly_digest_schedule")


def tick(schedule: dg.ScheduleDefinition, world: World, at: datetime, **delivery: Any) -> Any:
    """The schedule's tick at `at`, as the daemon (or the UI's preview) evaluates it."""
    with dg.build_schedule_context(
        scheduled_execution_time=at,
        resources=world.resources(**delivery),
        repository_def=project().get_repository_def(),
    ) as context:
        return schedule.evaluate_tick(context)


@pytest.mark.parametrize(
    ("at", "partition"),
    [
        (T0, "2026-W42-1"),  # Monday 2026-10-19 06:00: the week that has just ended
        (datetime(2026, 1, 5, 6, 0, tzinfo=UTC), "2026-W01-1"),  # the week 2025-12-29 starts
        # ticks in ISO week 1 ask for the previous ISO year's last week: 52 or 53 weeks long
        (datetime(2025, 12, 29, 6, 0, tzinfo=UTC), "2025-W52-1"),
        (datetime(2027, 1, 4, 6, 0, tzinfo=UTC), "2026-W53-1"),
        (datetime(2025, 1, 13, 6, 0, tzinfo=UTC), "2025-W02-1"),  # the suite's first week
    ],
)
def test_a_monday_tick_requests_the_week_that_just_ended_once(schedule, world_of, at, partition):
    world = world_of(0)
    world.clock.set(at)

    [request] = tick(schedule, world, at).run_requests or []
    [again] = tick(schedule, world, at).run_requests or []

    assert (request.partition_key, request.run_key) == (partition, partition)
    assert request.tags["dagster/partition"] == partition
    assert request.tags["dagster/schedule_name"] == "weekly_digest_schedule"
    assert request.job_name in (None, JOB)
    assert again.run_key == request.run_key  # one run per week, however often evaluated


def test_a_tick_for_a_week_whose_window_closed_skips_with_the_refusal(schedule, world_of):
    world = world_of(0)

    data = tick(schedule, world, T0, **HOUR_WINDOW)

    assert not data.run_requests
    assert data.skip_message == (
        "period 2026-W42: its delivery window closed at 2026-10-19 01:00 UTC before any digest "
        "was attempted; nothing was recorded (to send it late: digest run --period 2026-W42 "
        "--deliver-late --reason TEXT, or a run tagged digest/deliver_late=REASON and "
        "digest/operator=NAME)"
    )


def test_a_late_evaluation_asks_about_the_window_now_and_a_preview_about_the_tick(
    schedule, world_of
):
    world = world_of(0)
    world.clock.set(T0 + timedelta(days=8))  # the default 7-day window closed yesterday
    assert "period 2026-W42: its delivery window closed" in tick(schedule, world, T0).skip_message

    world.clock.set(T0 - timedelta(days=30))  # previewing the tick a month ahead
    assert "period 2026-W42" in tick(schedule, world, T0, **HOUR_WINDOW).skip_message
    assert tick(schedule, world, T0).run_requests


def test_a_closed_week_with_a_late_grant_is_requested(schedule, world_of):
    world = world_of(0)
    policy = DeliveryPolicy(delivery_window=timedelta(hours=1))
    grant_late_delivery(world.ledger, policy, W42, T0 - timedelta(hours=1), "ops", "outage")

    [request] = tick(schedule, world, T0, **HOUR_WINDOW).run_requests or []

    assert request.partition_key == PARTITION


def test_a_tick_before_the_first_week_ends_skips_naming_the_setting(schedule, world_of):
    world = world_of(0)
    at = datetime(2025, 1, 6, 6, 0, tzinfo=UTC)  # 2025-W02, the suite's first week, just began
    world.clock.set(at)

    assert tick(schedule, world, at).skip_message == (
        "no week that ended by 2025-01-06 06:00 UTC is a partition: the weekly job starts at "
        "2025-W02 (DIGEST_FIRST_WEEK)"
    )


def test_the_schedule_runs_the_weekly_job_on_monday_morning_and_starts_stopped(schedule):
    assert schedule.job_name == JOB
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
    assert metadata(result, "digest_deliveries")["this_run_sent"] == 1
    cleanup = metadata(result, "digest_cleanup")
    assert (cleanup["this_run_cleaned"], cleanup["cleaned"]) == (1, 3)
    assert "no open week" in sweep(world).skip_message


def test_the_sweepers_requests_are_runs_of_the_weekly_job_selecting_delivery_and_cleanup(
    world_of,
):
    world = world_of(3)
    world.materialize(selection=BEFORE_DELIVERY)
    lease = DeliveryPolicy().lease
    world.ledger.claim_due(T0, "crashed-worker", lease, 3, W42)
    world.clock.advance(lease + timedelta(seconds=1))

    [request] = sweep(world).run_requests

    # the daemon makes the run of the sensor's job, subset to the request's assets
    assert project().resolve_sensor_def("digest_retry_sweeper").job_name == JOB
    assert request.job_name in (None, JOB)
    assert (request.asset_selection, request.tags["dagster/partition"]) == (SWEEP_KEYS, PARTITION)
    job = project().resolve_job_def(JOB).get_subset(asset_selection=set(request.asset_selection))
    assert job.name == JOB
    assert set(job.asset_layer.executable_asset_keys) == set(SWEEP_KEYS)
    # and no job of the sensor's own exists to list its runs under
    assert [j.name for j in project().get_repository_def().get_all_jobs()] == [
        "__ASSET_JOB",
        JOB,
    ]


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
    assert (deliveries["this_run_lease_requeued"], deliveries["this_run_sent"]) == (2, 2)
    # the provider never saw customer 1's key: reconciliation makes it due again, unsent
    assert deliveries["this_run_reconciled"] == 1
    assert [ledger.get(key_of(n)).state for n in (1, 2, 3)] == [
        DeliveryState.RETRY_SCHEDULED,
        DeliveryState.CLEANED,
        DeliveryState.CLEANED,
    ]
    [retry] = sweep(world).run_requests
    run_requested(world, retry)
    assert ledger.get(key_of(1)).state is DeliveryState.CLEANED
    assert world.mailer.deliveries_for(key_of(1)) == 1


def test_a_missed_week_refuses_its_sweep_run_visibly_and_records_nothing(world_of):
    world = world_of(3)
    world.materialize(selection=BEFORE_DELIVERY)
    world.clock.set(DeliveryPolicy().closes_at(W42) + timedelta(hours=1))
    before = world.ledger.state_counts(W42)

    [request] = sweep(world).run_requests
    result = world.materialize(
        selection=[k.to_user_string() for k in request.asset_selection], raise_on_error=False
    )

    line = refusal(world, result)
    assert "before any digest was attempted" in line
    assert "--deliver-late" in line
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
