"""The project's own digest instance as the tests take it: from the code location's Definitions.

Every asset, check step, sensor and partitions definition here is the one the code location's
`WeeklyDigest` instance (`digest_pipeline/defs/weekly_digest/defs.yaml`) built, loaded once per
test session.
"""

import functools

import dagster as dg

from digest_pipeline.definitions import defs

ASSET_NAMES = (
    "eligibility_snapshot",
    "digest_content",
    "digest_work_items",
    "digest_deliveries",
    "digest_cleanup",
)


@functools.cache
def project() -> dg.Definitions:
    """The project's own Definitions, loaded once per test session."""
    return defs()


def asset(name: str) -> dg.AssetsDefinition:
    """One of the default instance's five assets, by name."""
    return project().get_assets_def(name)


def deliveries_checks() -> dg.AssetsDefinition:
    """The step that evaluates `digest_deliveries`' checks.

    Loading a component hands it back as a checks-only `AssetsDefinition`, so it is found by
    its check keys rather than its type.
    """
    key = dg.AssetCheckKey(dg.AssetKey("digest_deliveries"), "no_silent_timeout")
    [step] = [d for d in project().asset_checks or [] if key in d.check_keys]
    return step


def sweeper() -> dg.SensorDefinition:
    """The default instance's retry sweeper."""
    return project().get_unresolved_sensor_def("digest_retry_sweeper")


def partitions() -> dg.WeeklyPartitionsDefinition:
    """The weekly partitions of the default instance's job."""
    found = project().resolve_job_def("weekly_digest_job").partitions_def
    assert isinstance(found, dg.WeeklyPartitionsDefinition)
    return found
