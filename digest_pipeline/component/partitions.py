"""The weekly partitions an instance's assets and checks share: ISO weeks from its first week.

Keys are the ISO week date of each week's Monday (`2026-W42-1`, UTC), so the UI finds a week by
typing `W42` and `Period.parse(key)` maps a partition to its period. Only completed weeks from
`first_week` (read once per instance, when the definitions load: `spec.DigestSpec`) on are
partitions.
"""

import logging
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg

from digest_pipeline.adapters.sql.first_week import LedgerUnreadable, earliest_period
from digest_pipeline.domain.errors import InvalidPeriod
from digest_pipeline.domain.periods import FIRST_PERIOD, Period
from digest_pipeline.settings import default_database_url, load_first_week

#: the partition key's format: the ISO 8601 week date (`2026-W42-1`), which Dagster both writes
#: and parses with `day_offset=1`
KEY_FORMAT = "%G-W%V-%u"

logger = logging.getLogger(__name__)


def latest_complete_week(now: datetime) -> Period:
    """The week that ended most recently before `now` (UTC)."""
    return Period.of((now.astimezone(UTC) - timedelta(days=7)).date())


def first_week(env: Mapping[str, str], root: Path, now: datetime) -> Period:
    """The first week the weekly job partitions.

    `DIGEST_FIRST_WEEK` when set; otherwise the earliest week the ledger holds (a frozen snapshot
    or a work item), never later than the latest complete week, so that week is always a
    partition; the latest complete week alone while the ledger does not exist or holds nothing,
    and, with one warning line, when it cannot be read. A bad `DIGEST_FIRST_WEEK` raises
    InvalidSetting, so the code location refuses to load with that one line.
    """
    if (configured := load_first_week(env)) is not None:
        return configured
    latest = latest_complete_week(now)
    url = env.get("DIGEST_DATABASE_URL", "").strip() or default_database_url(root)
    try:
        earliest = earliest_period(url)
    except LedgerUnreadable as e:
        logger.warning(
            "the ledger could not be read (%s); the weekly partitions start at the latest "
            "complete week, %s (DIGEST_FIRST_WEEK sets the first week)",
            e,
            latest,
        )
        return latest
    if earliest is None:
        return latest
    return max(FIRST_PERIOD, min(earliest, latest))


def weekly_partitions_from(first: Period) -> dg.WeeklyPartitionsDefinition:
    """Completed ISO weeks from `first` on, keyed by their Monday's ISO week date (UTC)."""
    return dg.WeeklyPartitionsDefinition(
        start_date=first.starts_at, day_offset=1, timezone="UTC", fmt=KEY_FORMAT
    )


def require_partition(period: Period, partitions: dg.WeeklyPartitionsDefinition) -> None:
    """Raises InvalidPeriod, one line naming DIGEST_FIRST_WEEK, unless `period` is a partition.

    A run of a week before the job's first would record a week its partition grid and plots
    never show, so it is refused before anything is recorded.
    """
    if partitions.has_partition_key(period.partition_key):
        return
    first = Period.of(partitions.start.date())
    if period < FIRST_PERIOD:
        raise InvalidPeriod(f"period {period} is before {FIRST_PERIOD}, the first week any run has")
    if period < first:
        raise InvalidPeriod(
            f"period {period} is before {first}, the weekly job's first week: set "
            f"DIGEST_FIRST_WEEK={period} (or earlier), for digest and Dagster alike, to run it"
        )
    raise InvalidPeriod(f"period {period} is not a partition of the weekly job: it has not ended")
