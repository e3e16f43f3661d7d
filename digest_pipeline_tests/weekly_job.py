"""The project's weekly job for the seeded week (2026-W42), run in-process into a given instance.

It needs the definitions, a face above the rigs, so it stays in the tests; the week itself is
seeded by `digest_pipeline.rigs.servers.webserver.seed_week`. The PostgreSQL storage test and the
webserver GraphQL test both use it.
"""

import dagster as dg

from digest_pipeline.definitions import defs
from digest_pipeline.rigs.servers.webserver import JOB, PARTITION


def materialize_week(instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    """Runs the project's weekly job for 2026-W42 into `instance` (the `DIGEST_*` env is set)."""
    job = defs().resolve_job_def(JOB)
    return job.execute_in_process(partition_key=PARTITION, instance=instance)
