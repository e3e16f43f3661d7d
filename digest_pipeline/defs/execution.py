"""How every run of this code location executes: the one place the executor is chosen.

`executor=` on the code location's `Definitions` is the default of every job that names none:
`weekly_digest_job` (the schedule, the launchpad, `digest run`), the implicit asset job behind
the asset graph's "Materialize" button, and the sweep sensor's asset-selection runs. The default
is in-process: the job has about a dozen steps of seconds each, and a process per step (Dagster's
own default, `multiprocess`) costs more than the steps themselves (README, "Launching from the
UI"). Run config can still ask for `execution: {config: {multiprocess: {max_concurrent: N}}}`,
the same shape as Dagster's default executor, for one run. `Definitions.merge` refuses a second
executor, so no other module may set one.

This module also makes the job's snapshot id the same in every process that loads the code
location (`stable_blocking_check_order`), so a `digest run` run and a UI launch share the one
snapshot the code location reports.
"""

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import dagster as dg
from dagster._core.definitions.assets.job import asset_job

#: in-process unless the run config selects `multiprocess`
digest_executor = dg.multi_or_in_process_executor.configured(
    lambda config: config,
    name="in_process_or_multiprocess",
    # Dagster's default executor's own selector (`in_process` | `multiprocess`), another default
    config_schema=dg.Field(
        dg.multi_or_in_process_executor.config_schema.as_field().config_type,
        default_value={"in_process": {}},
    ),
    description="In-process by default; `multiprocess: {max_concurrent: N}` for a process per "
    "step.",
)

_BLOCKING_ORDER = "_get_blocking_asset_check_output_handles_by_asset_key"
_stable: set[Callable[..., Any]] = set()


def stable_blocking_check_order() -> None:
    """Breaks Dagster's tie between blocking checks by node name, so the job snapshot is stable.

    Dagster 1.13 orders the blocking checks a downstream asset waits on by output name only
    (`dagster/_core/definitions/assets/job/asset_job.py`), and every `@asset_check` op's output
    is `result`; with several blocking checks on `digest_deliveries` the order is a set's, and on
    Python 3.11 that follows `hash(None)`, an address. So each process that loads the code
    location (the webserver's code server, the daemon's, `digest run`) got another job snapshot
    id, and a run made outside the webserver never matched the job it ran. The order Dagster
    gives is kept; only ties are broken, by node name.
    """
    original = getattr(asset_job, _BLOCKING_ORDER)
    if original in _stable:
        return

    @functools.wraps(original)
    def ordered(*args: Any, **kwargs: Any) -> Mapping[dg.AssetKey, Sequence[Any]]:
        return {
            key: sorted(handles, key=lambda h: (h.output_name, str(h.node_handle)))
            for key, handles in original(*args, **kwargs).items()
        }

    _stable.add(ordered)
    setattr(asset_job, _BLOCKING_ORDER, ordered)


@dg.definitions
def execution() -> dg.Definitions:
    """The executor of every job of the code location (and a stable job snapshot)."""
    stable_blocking_check_order()
    return dg.Definitions(executor=digest_executor)
