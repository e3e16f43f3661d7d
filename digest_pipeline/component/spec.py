"""What one instance's definitions are built from: its names, its settings and its partitions.

An instance's settings are the process's `DIGEST_*` environment with the instance's own values
laid over it (`settings`, from its YAML), so one variable set for the whole project applies to
every instance that does not set its own. They are read when the definitions load only for what
Dagster fixes then (the partitions' first week, the lineage, the schedule); the resources read
them again at run time.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg

from digest_pipeline.component.layered_env import instance_env
from digest_pipeline.component.naming import Names
from digest_pipeline.component.partitions import first_week, weekly_partitions_from
from digest_pipeline.source_settings import SourceSettings, read_source

#: Monday 06:00 UTC: the week that has just ended is complete
DEFAULT_CRON = "0 6 * * 1"


@dataclass(frozen=True)
class DigestSpec:
    """One instance of the weekly digest: its names, `DIGEST_*` values, schedule and partitions."""

    names: Names
    #: the instance's own `DIGEST_*` values, laid over the process's environment
    settings: Mapping[str, str] = field(default_factory=dict)
    cron: str = DEFAULT_CRON
    #: the environment under the instance's values; None: the process's
    base: Mapping[str, str] | None = field(default=None, compare=False, repr=False)
    partitions: dg.WeeklyPartitionsDefinition = field(init=False, compare=False, repr=False)
    source: SourceSettings = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        env, root = self.env(), Path.cwd()
        # Dagster fixes a job's partitions when the definitions load: read once, here
        first = first_week(env, root, datetime.now(UTC))
        object.__setattr__(self, "partitions", weekly_partitions_from(first))
        object.__setattr__(self, "source", read_source(env, root))

    def env(self) -> dict[str, str]:
        """The environment this instance's settings are read from, now."""
        return instance_env(self.settings, self.base)

    def upstream(self, *kinds: str) -> list[dg.AssetKey]:
        """The team's assets the source config names for `kinds` (`asset:`), in that order."""
        return [
            dg.AssetKey(list(a)) for k in kinds if (a := self.source.entity(k).asset) is not None
        ]
