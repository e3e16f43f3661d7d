"""How every run of this code location executes: the one place the executor is chosen.

`executor=` on the code location's `Definitions` is the default of every job that names none:
`weekly_digest_job` (the schedule, the sweep sensor, the launchpad, `digest run`) and the
implicit asset job behind the asset graph's "Materialize" button, so all of them run on the
executor `DIGEST_EXECUTOR` names when the definitions load (read at load time, as
`DIGEST_FIRST_WEEK` is: Dagster fixes a job's executor then):

- `in_process` (default): the job has about a dozen steps of seconds each, and a process per
  step costs more than the steps themselves (README, "Launching from the UI"). Run config can
  still ask for `execution: {config: {multiprocess: {max_concurrent: N}}}` for one run.
- `multiprocess`: the same selector with a process per step as its default.
- `celery`: `dagster_celery.celery_executor` on `DIGEST_CELERY_BROKER_URL` (extra `celery`).
- `k8s`: `dagster_k8s.k8s_job_executor`, configured in run config (extra `k8s`; README).

Whichever it is, the executor records the launcher's `DIGEST_*` settings on the run before any
step starts, so a step process with other settings refuses (run_settings.py). Step outputs go
through the ledger (io_manager.py), so no executor needs a shared disk. `Definitions.merge`
refuses a second executor, so no other module may set one.
"""

import os
from collections.abc import Iterator, Mapping
from typing import Any

import dagster as dg

from digest_pipeline.component.run_settings import run_settings_tag
from digest_pipeline.dagster_private import (
    ExecutionPlan,
    Executor,
    InitExecutorContext,
    PlanOrchestrationContext,
)
from digest_pipeline.executor_settings import ExecutorSettings, load_executor_settings
from digest_pipeline.settings import InvalidSetting

#: Celery settings beyond the broker: a step is one task, taken one at a time by a worker, and a
#: task whose worker process dies is failed (so the run fails and the sweep takes the week over)
#: rather than redelivered while its items are still leased
CELERY_CONFIG_SOURCE: Mapping[str, Any] = {
    "worker_prefetch_multiplier": 1,
    "task_acks_late": False,
    "task_reject_on_worker_lost": False,
}


class _RecordingExecutor(Executor):
    """Records the launcher's `DIGEST_*` settings on the run, then delegates to `inner`."""

    def __init__(self, inner: Executor) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        # executors read their own attributes through the context (`executor.app_args()`)
        return getattr(self._inner, name)

    @property
    def retries(self) -> Any:
        return self._inner.retries

    @property
    def step_dependency_config(self) -> Any:
        return self._inner.step_dependency_config

    def execute(
        self, plan_context: PlanOrchestrationContext, execution_plan: ExecutionPlan
    ) -> Iterator[dg.DagsterEvent]:
        plan_context.instance.add_run_tags(plan_context.run_id, run_settings_tag(os.environ))
        yield from self._inner.execute(plan_context, execution_plan)


def recording(defn: dg.ExecutorDefinition) -> dg.ExecutorDefinition:
    """`defn`, whose executor first records the launcher's settings on the run."""
    create = defn.executor_creation_fn
    assert create is not None, defn.name

    def create_recording(init_context: InitExecutorContext) -> Executor:
        return _RecordingExecutor(create(init_context))

    return dg.ExecutorDefinition(
        name=defn.name,
        config_schema=defn.config_schema.as_field(),
        requirements=defn.get_requirements,
        executor_creation_fn=create_recording,
        description=defn.description,
    )


def _selector(default: str) -> dg.ExecutorDefinition:
    """Dagster's default executor (`in_process` | `multiprocess`), with another default."""
    return recording(dg.multi_or_in_process_executor).configured(
        lambda config: config,
        name="in_process_or_multiprocess",
        config_schema=dg.Field(
            dg.multi_or_in_process_executor.config_schema.as_field().config_type,
            default_value={default: {}},
        ),
        description=f"{default} by default; run config may choose `in_process` or "
        "`multiprocess: {max_concurrent: N}`.",
    )


#: in-process unless the run config selects `multiprocess` (the `DIGEST_EXECUTOR` default)
digest_executor = _selector("in_process")


def _extra(module: str, extra: str) -> Any:
    try:
        return __import__(module)
    except ImportError as exc:
        raise InvalidSetting(
            f"DIGEST_EXECUTOR={extra} needs the `{extra}` extra: "
            f"pip install 'digest_pipeline[{extra}]' ({exc})"
        ) from exc


def build_executor(settings: ExecutorSettings) -> dg.ExecutorDefinition:
    """The executor definition `settings` name."""
    if settings.name == "in_process":
        return digest_executor
    if settings.name == "multiprocess":
        return _selector(settings.name)
    if settings.name == "celery":
        celery = _extra("dagster_celery", "celery")
        return recording(celery.celery_executor).configured(
            {
                "broker": settings.celery_broker_url,
                "backend": settings.celery_backend_url,
                "config_source": dict(CELERY_CONFIG_SOURCE),
            },
            name="celery",
        )
    k8s = _extra("dagster_k8s", "k8s")
    return recording(k8s.k8s_job_executor)


@dg.definitions
def execution() -> dg.Definitions:
    """The executor of every job of the code location."""
    return dg.Definitions(executor=build_executor(load_executor_settings(os.environ)))
