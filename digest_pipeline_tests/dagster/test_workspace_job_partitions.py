"""`digest run`'s in-process launch refuses a key that is no partition of the location's job."""

from pathlib import Path

import dagster as dg
import pytest

from digest_pipeline.cli.context import UsageError
from digest_pipeline.cli.workspace_job import execute_workspace_job
from digest_pipeline.rigs.bootstrap import PROJECT_ROOT
from digest_pipeline_tests.dagster.graph import partitions

JOB = "weekly_digest_job"


@pytest.mark.parametrize(
    "key",
    [
        "2024-W50-1",  # before the suite's first week (conftest: DIGEST_FIRST_WEEK=2025-W02)
        "2026-10-12",  # a Monday's calendar date, not its ISO week date
    ],
)
def test_a_key_that_is_no_partition_is_refused_before_any_run_is_made(tmp_path: Path, key: str):
    last = partitions().get_last_partition_key()

    with dg.DagsterInstance.ephemeral(tempdir=str(tmp_path)) as instance:
        with pytest.raises(UsageError) as refused:
            execute_workspace_job(instance, PROJECT_ROOT / "workspace.yaml", JOB, key, {})

        assert instance.get_runs() == []
    assert str(refused.value) == (
        f"{key} is not a partition of {JOB} (its partitions: from 2025-W02-1 to {last}; "
        "DIGEST_FIRST_WEEK sets the first week)"
    )
