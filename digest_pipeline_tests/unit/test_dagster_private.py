"""The private Dagster APIs the project uses: only through one module, and as the code uses them.

Each test pins the shape a use relies on (a member, a parameter, a field), so a Dagster upgrade
that changes one fails here by name, not in a run.
"""

import ast
import inspect
from pathlib import Path

import dagster as dg
import pytest

from digest_pipeline import dagster_private as private

ROOT = Path(__file__).resolve().parents[2]
#: where a private import may not appear: everything the project ships or runs
SOURCES = ("digest_pipeline", "digest_pipeline_tests", "benchmarks", "docs")
ALLOWED = Path("digest_pipeline/dagster_private.py")


def private_imports(path: Path) -> list[str]:
    """The `dagster._…` modules a Python file imports."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dagster._"):
            found.append(node.module or "")
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("dagster._")]
    return found


def test_no_module_but_one_imports_a_private_dagster_api():
    offenders = {
        str(path.relative_to(ROOT)): mods
        for folder in SOURCES
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path.relative_to(ROOT) != ALLOWED and (mods := private_imports(path))
    }
    assert offenders == {}


def parameters(fn: object) -> list[str]:
    return list(inspect.signature(fn).parameters)  # type: ignore[arg-type]


def fields(record: type) -> tuple[str, ...]:
    """A Dagster record's (or NamedTuple's) fields, in their positional order."""
    found: tuple[str, ...] = getattr(record, "_fields", ())
    return found


def test_the_event_types_failure_lines_reads():
    assert {"RUN_FAILURE", "STEP_FAILURE"} <= set(private.DagsterEventType.__members__)


def test_execute_run_takes_the_job_the_run_and_the_instance():
    assert parameters(private.execute_run)[:3] == ["job", "dagster_run", "instance"]
    assert "raise_on_error" in parameters(private.execute_run)


def test_the_origins_digest_run_builds_its_run_from():
    # positional: `RemoteJobOrigin(RemoteRepositoryOrigin(origin, repo.name), job_name)`
    assert fields(private.InProcessCodeLocationOrigin)[:2] == (
        "loadable_target_origin",
        "location_name",
    )
    assert hasattr(private.InProcessCodeLocationOrigin, "create_location")
    assert fields(private.RemoteRepositoryOrigin) == ("code_location_origin", "repository_name")
    assert fields(private.RemoteJobOrigin) == ("repository_origin", "job_name")
    assert hasattr(private.ManagedGrpcPythonEnvCodeLocationOrigin, "loadable_target_origin")


def test_the_workspace_file_target_lists_its_origins():
    assert fields(private.WorkspaceFileTarget) == ("paths",)
    assert hasattr(private.WorkspaceFileTarget, "create_origins")


def test_the_executor_the_recording_executor_wraps():
    assert {"execute", "retries"} <= private.Executor.__abstractmethods__
    assert parameters(private.Executor.execute)[1:] == ["plan_context", "execution_plan"]
    assert private.PlanOrchestrationContext.__name__ == "PlanOrchestrationContext"
    assert private.ExecutionPlan.__name__ == "ExecutionPlan"
    assert "executor_config" in dir(private.InitExecutorContext)


def test_the_storage_class_data_the_postgres_storage_is_built_from():
    assert private.ConfigurableClassData._fields[:3] == ("module_name", "class_name", "config_yaml")


def test_an_instance_ref_from_a_folder():
    assert parameters(private.InstanceRef.from_dir)[0] == "base_dir"


@pytest.mark.parametrize("status", ["SKIPPED", "EXECUTION_FAILED", "FAILED", "SUCCEEDED"])
def test_the_check_statuses_the_refused_week_tests_resolve(status):
    assert status in private.AssetCheckExecutionResolvedStatus.__members__


def test_a_loading_context_for_a_test_takes_the_instance():
    assert parameters(private.LoadingContextForTest) == ["instance"]


def test_the_termination_thread_the_run_worker_starts():
    assert parameters(private.start_termination_thread)[:2] == [
        "should_stop_event",
        "is_done_event",
    ]


def test_the_type_an_asset_job_is_before_it_is_resolved():
    # each instance's schedule and sensor are built over its job as `define_asset_job` returns it
    assert isinstance(dg.define_asset_job("weekly"), private.UnresolvedAssetJobDefinition)
