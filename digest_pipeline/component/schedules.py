"""An instance's weekly job over its five assets (their checks come along) and its schedule.

Each tick (Monday 06:00 UTC unless the instance sets its own cron) requests the week that has
just ended (a tick on 2026-10-19 runs partition `2026-W42-1`), one run per week, or skips with
the reason a run would be refused: the week's delivery window has closed, or the week is not a
partition. It starts stopped, and the job names no executor: it runs with the code location's
(this project's: `defs/execution.py`, in-process).
"""

from datetime import datetime

import dagster as dg

from digest_pipeline.component.naming import INSTANCE_TAG
from digest_pipeline.component.spec import DigestSpec
from digest_pipeline.dagster_private import UnresolvedAssetJobDefinition
from digest_pipeline.domain.periods import Period
from digest_pipeline.services import period_gate

#: the period's whole graph, in order; referenced by key so this module defines no assets
DIGEST_ASSETS = (
    "eligibility_snapshot",
    "digest_content",
    "digest_work_items",
    "digest_deliveries",
    "digest_cleanup",
)


def build_job(digest: DigestSpec) -> UnresolvedAssetJobDefinition:
    """The instance's weekly job over its five assets (their checks come along)."""
    names = digest.names
    return dg.define_asset_job(
        names.named("weekly_digest_job"),
        selection=dg.AssetSelection.assets(*(names.asset(a) for a in DIGEST_ASSETS)),
        description="One week's digest: snapshot, content, work items, deliveries and cleanup.",
        tags={INSTANCE_TAG: names.instance},
    )


def week_ended_before(partitions: dg.WeeklyPartitionsDefinition, tick: datetime) -> Period | None:
    """The last partition whose week ends at or before `tick`; None before the first week."""
    with dg.partition_loading_context(effective_dt=tick):
        key = partitions.get_last_partition_key()
    return None if key is None else Period.parse(key)


def build_schedule(digest: DigestSpec, job: UnresolvedAssetJobDefinition) -> dg.ScheduleDefinition:
    """The instance's weekly schedule (its `cron`, UTC), stopped until an operator starts it."""
    names = digest.names

    @dg.schedule(
        name=names.named("weekly_digest_schedule"),
        cron_schedule=digest.cron,
        execution_timezone="UTC",
        job=job,
        default_status=dg.DefaultScheduleStatus.STOPPED,
        required_resource_keys=names.keys("ledger", "clock", "delivery"),
        description="Each tick (every Monday 06:00 UTC unless the instance sets its own): the "
        "digest of the week that has just ended; skipped, with the reason, when its delivery "
        "window has closed.",
    )
    def weekly_digest_schedule(
        context: dg.ScheduleEvaluationContext,
    ) -> dg.RunRequest | dg.SkipReason:
        """Requests the week that ended before the tick, unless a run of it would be refused."""
        r = names.resources(context.resources)
        tick = context.scheduled_execution_time
        period = week_ended_before(digest.partitions, tick)
        if period is None:
            first = Period.of(digest.partitions.start.date())
            return dg.SkipReason(
                f"no week that ended by {tick:%Y-%m-%d %H:%M} UTC is a partition: the weekly job "
                f"starts at {first} (DIGEST_FIRST_WEEK)"
            )
        # The run starts at the tick, or now when the tick is evaluated late: a preview of a
        # future tick asks about then, a late evaluation about what the run will meet.
        now = max(tick, r.clock.now())
        policy = r.delivery.settings().policy
        if (why := period_gate.refusal(r.ledger, policy, period, now)) is not None:
            return dg.SkipReason(why)
        # The partition key as run key: one run per week, however often the tick is evaluated.
        return dg.RunRequest(run_key=period.partition_key, partition_key=period.partition_key)

    return weekly_digest_schedule
