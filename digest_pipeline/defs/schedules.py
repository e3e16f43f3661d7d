"""The weekly job over the five assets (their checks come along) and its schedule.

The schedule is built from the partitioned job: each Monday 06:00 UTC tick requests the week that
has just ended (a tick on 2026-10-19 runs partition `2026-10-12`, 2026-W42), once per tick. It
starts stopped; turn it on in the UI or with `dagster schedule start weekly_digest_schedule`.
The job names no executor: it runs with the code location's (`defs/execution.py`, in-process).
"""

import dagster as dg

#: the period's whole graph, in order; referenced by key so this module defines no assets
DIGEST_ASSETS = (
    "eligibility_snapshot",
    "digest_content",
    "digest_work_items",
    "digest_deliveries",
    "digest_cleanup",
)

weekly_digest_job = dg.define_asset_job(
    "weekly_digest_job",
    selection=dg.AssetSelection.assets(*DIGEST_ASSETS),
    description="One week's digest: snapshot, content, work items, deliveries and cleanup.",
)

weekly_digest_schedule = dg.build_schedule_from_partitioned_job(
    weekly_digest_job,
    name="weekly_digest_schedule",
    description="Every Monday 06:00 UTC: the digest of the week that has just ended.",
    hour_of_day=6,
    minute_of_hour=0,
)
