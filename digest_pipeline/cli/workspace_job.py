"""Runs one job of the workspace's code location in this process, as the webserver would launch it.

`job.execute_in_process` records each run under an ephemeral job of its own: its own snapshot, no
code-location origin, so the job's Runs tab never lists it and the Overview timeline shows it as
jobless. Here the code location `workspace.yaml` names is loaded in this process (the same
loader its code server uses), the run is created from that location's job exactly as the UI's
launch creates it (its snapshot, execution plan, tags, origins), with the origin the webserver
reports (`ManagedGrpcPythonEnvCodeLocationOrigin` from `workspace.yaml`), and then executed in
this process with the job's own executor (`dagster._core.execution.api.execute_run`).
"""

import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dagster as dg

from digest_pipeline.cli.context import UsageError
from digest_pipeline.cli.files import read_input
from digest_pipeline.dagster_private import (
    DagsterEventType,
    InProcessCodeLocationOrigin,
    ManagedGrpcPythonEnvCodeLocationOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
    WorkspaceFileTarget,
    execute_run,
)

_SCHEDULE_ENV_VARS = r"Property `ScheduleDefinition.environment_vars` is deprecated"
#: a component's check steps come back from loading as plain AssetsDefinitions, which Dagster
#: (1.13.27, `repository_data.py`) turns back into checks through a beta parameter
_CHECKS_REBUILT = r"Parameter `execution_type` of function `AssetsDefinition.__init__`"


def workspace_origin(workspace: Path) -> ManagedGrpcPythonEnvCodeLocationOrigin:
    """The one Python code location `workspace` names, as the webserver builds its origin."""
    if not workspace.is_file():
        raise UsageError(
            f"no {workspace.name} in {workspace.parent}: run digest from the project folder"
        )
    read_input(workspace, workspace.name)  # Dagster reads it whole: refuse an oversized one
    origins = WorkspaceFileTarget(paths=[str(workspace)]).create_origins()
    python = [o for o in origins if isinstance(o, ManagedGrpcPythonEnvCodeLocationOrigin)]
    if len(python) != 1 or len(origins) != 1:
        names = ", ".join(o.location_name for o in origins) or "none"
        raise UsageError(f"{workspace} must name exactly one Python code location (found {names})")
    return python[0]


def load_location(
    instance: dg.DagsterInstance,
    workspace: Path,
    origin: ManagedGrpcPythonEnvCodeLocationOrigin | None = None,
) -> Any:
    """The code location `workspace` names, loaded in this process (a context manager).

    Loading it builds every definition, `WeeklyDigest` instances included (component/registry).
    """
    origin = workspace_origin(workspace) if origin is None else origin
    local = InProcessCodeLocationOrigin(
        loadable_target_origin=origin.loadable_target_origin, location_name=origin.location_name
    )
    with warnings.catch_warnings():
        # Dagster's own snapshot of the schedule reads this deprecated property (1.13.27,
        # `external_data.py::ScheduleSnap.from_def`): nothing a user of `digest run` can change
        warnings.filterwarnings("ignore", _SCHEDULE_ENV_VARS, DeprecationWarning)
        warnings.filterwarnings("ignore", _CHECKS_REBUILT)
        try:
            return local.create_location(instance)
        except Exception as e:
            # the project's own code (a merged code location): its error, one line, no traceback
            first = (str(e).strip().splitlines() or [""])[0]
            raise UsageError(
                f"code location {origin.location_name} ({workspace.name}) does not load: "
                f"{type(e).__name__}: {first}"
            ) from e


def execute_workspace_job(
    instance: dg.DagsterInstance,
    workspace: Path,
    job_name: str,
    partition_key: str,
    run_config: Mapping[str, Any],
) -> dg.JobExecutionResult:
    """Creates the job's run for the partition as the code location defines it; runs it here.

    The run carries the location's job snapshot, its code origin and the workspace's remote
    origin (so the `.dagster/repository` tag), and `raise_on_error=False` turns a failed step
    into a failed run, as before.
    """
    origin = workspace_origin(workspace)
    location = load_location(instance, workspace, origin)
    with location:
        repos = [r for r in location.get_repositories().values() if r.has_job(job_name)]
        if not repos:
            raise UsageError(f"code location {origin.location_name} has no job {job_name}")
        repo = repos[0]
        remote_job = repo.get_full_job(job_name)
        recon_job = location.get_reconstructable_job(repo.name, job_name)
        _require_partition(recon_job.get_definition(), partition_key)
        plan = location.get_execution_plan(
            remote_job, run_config, step_keys_to_execute=None, known_state=None, instance=instance
        ).execution_plan_snapshot
        partition_tags = recon_job.get_definition().get_tags_for_partition_key(
            partition_key, selected_asset_keys=None
        )
        run = instance.create_run(
            job_name=job_name,
            run_id=None,
            run_config=run_config,
            status=None,
            tags={**remote_job.run_tags, **partition_tags},
            root_run_id=None,
            parent_run_id=None,
            step_keys_to_execute=plan.step_keys_to_execute,
            execution_plan_snapshot=plan,
            job_snapshot=remote_job.job_snapshot,
            parent_job_snapshot=remote_job.parent_job_snapshot,
            asset_selection=None,
            asset_check_selection=None,
            resolved_op_selection=None,
            op_selection=None,
            remote_job_origin=RemoteJobOrigin(RemoteRepositoryOrigin(origin, repo.name), job_name),
            job_code_origin=remote_job.get_python_origin(),
            asset_graph=repo.asset_graph,
        )
        return execute_run(recon_job, run, instance, raise_on_error=False)


def _require_partition(job: dg.JobDefinition, partition_key: str) -> None:
    """Refuses a key that is not a partition of the job: its run would be outside the grid.

    Dagster runs any key it can parse (a week before the first, say) without a word, and the
    run's assets would record a week the job's partitions, its grid and its plots never show.
    """
    partitions = job.partitions_def
    if partitions is None or partitions.has_partition_key(partition_key):
        return
    first, last = partitions.get_first_partition_key(), partitions.get_last_partition_key()
    held = f"from {first} to {last}" if first and last else "none yet"
    raise UsageError(
        f"{partition_key} is not a partition of {job.name} (its partitions: {held}; "
        "DIGEST_FIRST_WEEK sets the first week)"
    )


def failure_lines(instance: dg.DagsterInstance, run_id: str, refused: str) -> list[str]:
    """Why the run failed: each failed step's innermost error and each refusal, one line each.

    Read from the run's event log, which every step process writes to: the failure of a step on
    a Celery worker or in a pod is nowhere else in this process. The innermost cause is the
    project's own one-line refusal when there is one (Dagster wraps a resource's error); a
    refusal while a step process opened its resources is logged starting with `refused`,
    because a Celery task's error reaches the launcher without its cause.
    """
    lines, workers = [], []
    for record in instance.all_logs(run_id):
        event = record.dagster_event
        if event is None:
            if record.user_message.startswith(refused):
                step = f"step {record.step_key}: " if record.step_key else ""
                lines.append(f"{step}{record.user_message}")
            continue
        if event.event_type == DagsterEventType.RUN_FAILURE:
            # a task that failed before the step began (a worker without DAGSTER_PG_URL, say)
            # is only in the executor's error, as "[step key]: Error: message" lines
            error = event.job_failure_data.error
            workers += _executor_step_errors(error.message if error is not None else "")
            continue
        if event.event_type != DagsterEventType.STEP_FAILURE or event.step_key is None:
            continue
        error = event.step_failure_data.error
        while error is not None and error.cause is not None:
            error = error.cause
        line = error.message.strip().splitlines()[0] if error is not None and error.message else ""
        lines.append(f"step {event.step_key} failed: {line}")
    return list(dict.fromkeys(lines or workers))


_EXCEPTION_LINE = re.compile(r"^[\w.]+(Error|Exception): ")


def _executor_step_errors(text: str) -> list[str]:
    """`step KEY failed: …` per "[KEY]: …" block of an executor's error, its innermost line.

    The innermost is the block's last "SomeError: message" line (a wrapped cause names the
    missing environment variable; the wrapper only says configuration failed to load).
    """
    found: dict[str, str] = {}
    key = None
    for line in text.splitlines():
        if line.startswith("[") and "]: " in line:
            key, _, first = line[1:].partition("]: ")
            found[key] = first
        elif line.startswith("Stack Trace"):
            key = None
        elif key is not None and _EXCEPTION_LINE.match(line):
            found[key] = line
    return [f"step {k} failed: {v}" for k, v in found.items()]
