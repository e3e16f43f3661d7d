"""The project's real Definitions with the `mailer` resource swapped for a benchmark mailer.

The benchmarks must time the real asset graph and checks, not a copy, so the only change is one
resource key. `bench_job` is the module-scope factory `dg.reconstructable` needs, so the
multiprocess executor's step processes rebuild the same job with the same mailer.
"""

import os
import threading
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import PrivateAttr

from benchmarks.bench_mailer import BenchMailer
from digest_pipeline.definitions import defs
from digest_pipeline.ports import Mailer

JOB = "weekly_digest_job"
#: milliseconds each send sleeps, read when the resource opens (step processes inherit it)
LATENCY_ENV = "BENCH_MAILER_LATENCY_MS"
#: a folder where every process appends the keys it sends to its own file
KEYS_DIR_ENV = "BENCH_MAILER_KEYS_DIR"


#: every BenchMailer opened in this process, so an in-process run's sends can be counted
OPENED: list[BenchMailer] = []


class BenchMailerResource(dg.ConfigurableResource[Mailer]):
    """Vends a BenchMailer; unset fields fall back to the `BENCH_MAILER_*` variables."""

    latency_ms: float | None = None
    keys_dir: str | None = None
    _mailer: BenchMailer | None = PrivateAttr(default=None)

    def create_resource(self, context: dg.InitResourceContext) -> Mailer:
        latency = self.latency_ms
        if latency is None:
            latency = float(os.environ.get(LATENCY_ENV, "0") or 0)
        keys_dir = self.keys_dir or os.environ.get(KEYS_DIR_ENV) or None
        keys_file = None
        if keys_dir:
            keys_file = Path(keys_dir) / f"keys-{os.getpid()}-{threading.get_ident()}.txt"
        self._mailer = BenchMailer(latency, keys_file)
        OPENED.append(self._mailer)
        return self._mailer

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._mailer is not None:
            self._mailer.close()


def bench_definitions(mailer: Any) -> dg.Definitions:
    """The project's Definitions with `mailer` bound to the given resource or Mailer.

    `Definitions.merge`/`with_resources` refuse a second value for a bound key, so the object is
    rebuilt from its public parts with the one key replaced.
    """
    project = defs()
    return dg.Definitions(
        assets=project.assets,
        asset_checks=project.asset_checks,
        jobs=project.jobs,
        resources={**(project.resources or {}), "mailer": mailer},
        # the project's executor (in-process unless the run config selects `multiprocess`)
        executor=project.executor,
    )


def bench_job() -> dg.JobDefinition:
    """`weekly_digest_job` with a BenchMailerResource configured from the environment."""
    return bench_definitions(BenchMailerResource()).resolve_job_def(JOB)
