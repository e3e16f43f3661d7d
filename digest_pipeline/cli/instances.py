"""`digest --instance NAME`: a command reads the settings of one `WeeklyDigest` instance.

The instance's YAML lives in the project's code location, so the command loads that location
(`workspace.yaml`, in this process, as `digest run` does) and takes the instance's own values
from what the component built: the command and the instance's Dagster runs read the same
settings, laid over the same environment.
"""

from pathlib import Path

import dagster as dg

from digest_pipeline.cli.context import UsageError
from digest_pipeline.cli.workspace_job import load_location
from digest_pipeline.component import registry
from digest_pipeline.component.naming import Names
from digest_pipeline.component.spec import DEFAULT_CRON, DigestSpec
from digest_pipeline.domain.periods import DEFAULT_INSTANCE, validate_instance_name

#: the code location the webserver loads, and `digest` with it
WORKSPACE = "workspace.yaml"


def instance_spec(root: Path, name: str) -> DigestSpec:
    """The instance named `name` as the project's code location builds it; UsageError if none."""
    try:
        validate_instance_name(name)
    except ValueError as e:
        raise UsageError(f"--instance: {e}") from e
    with dg.DagsterInstance.ephemeral() as instance, load_location(instance, root / WORKSPACE):
        spec = registry.built(name)
        if spec is None:
            found = ", ".join(registry.names()) or "none"
            raise UsageError(
                f"the code location of {WORKSPACE} has no digest instance {name} (found: {found})"
            )
    return spec


def default_spec() -> DigestSpec:
    """The default instance as this process's code location builds it (no `--instance`).

    From the process's environment, as the job `digest run` executes in this process reads it,
    so the command refuses exactly the weeks the job's partitions leave out.
    """
    return DigestSpec(Names(DEFAULT_INSTANCE), {}, DEFAULT_CRON)
