"""The weekly digest as a Dagster component: `WeeklyDigest`, and the graph it builds per instance.

`digest_pipeline.component.WeeklyDigest` is the type a `defs.yaml` names. It is imported on first
use, so a module of the graph can be imported without building the component's dependencies.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "WeeklyDigest":
        from digest_pipeline.component.weekly_digest import WeeklyDigest

        return WeeklyDigest
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
