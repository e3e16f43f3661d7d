"""Every private Dagster API the project and its tests use, imported in this one module.

Dagster promises none of these between releases. `digest_pipeline_tests/unit/test_dagster_private.py`
pins what each is used for, so an upgrade that moves or changes one fails there, by name,
instead of in a run.
"""

from dagster._core.definitions.unresolved_asset_job_definition import (
    UnresolvedAssetJobDefinition,
)
from dagster._core.events import DagsterEventType
from dagster._core.execution.api import execute_run
from dagster._core.execution.context.system import PlanOrchestrationContext
from dagster._core.execution.plan.plan import ExecutionPlan
from dagster._core.executor.base import Executor
from dagster._core.executor.init import InitExecutorContext
from dagster._core.instance.ref import InstanceRef
from dagster._core.loader import LoadingContextForTest
from dagster._core.remote_origin import (
    InProcessCodeLocationOrigin,
    ManagedGrpcPythonEnvCodeLocationOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)
from dagster._core.storage.asset_check_execution_record import (
    AssetCheckExecutionResolvedStatus,
)
from dagster._core.workspace.load_target import WorkspaceFileTarget
from dagster._serdes import ConfigurableClassData
from dagster._utils import start_termination_thread

__all__ = [
    "AssetCheckExecutionResolvedStatus",
    "ConfigurableClassData",
    "DagsterEventType",
    "ExecutionPlan",
    "Executor",
    "InProcessCodeLocationOrigin",
    "InitExecutorContext",
    "InstanceRef",
    "LoadingContextForTest",
    "ManagedGrpcPythonEnvCodeLocationOrigin",
    "PlanOrchestrationContext",
    "RemoteJobOrigin",
    "RemoteRepositoryOrigin",
    "UnresolvedAssetJobDefinition",
    "WorkspaceFileTarget",
    "execute_run",
    "start_termination_thread",
]
