"""The one partitions definition every asset and check shares: ISO weeks, keyed by Monday (UTC).

`day_offset=1` makes each key the Monday that starts an ISO week, so `Period.parse(key)` maps a
partition to its period (`2026-10-12` is 2026-W42). Only completed weeks are partitions.
"""

import dagster as dg

from digest_pipeline.domain.periods import FIRST_PERIOD

weekly_partitions = dg.WeeklyPartitionsDefinition(
    start_date=FIRST_PERIOD.partition_key, day_offset=1, timezone="UTC"
)
