"""Fixtures of the Dagster tier: an ephemeral instance per test and a world of fakes around it."""

from collections.abc import Callable, Iterator
from pathlib import Path

import dagster as dg
import pytest

from digest_pipeline_tests.dagster.harness import World


@pytest.fixture
def instance(tmp_path: Path) -> Iterator[dg.DagsterInstance]:
    # An explicit folder: without one Dagster leaves a TemporaryDirectory to the garbage
    # collector, which warns (ResourceWarning) and fails the run under filterwarnings=error.
    with dg.DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster")) as instance:
        yield instance


@pytest.fixture
def world_of(instance: dg.DagsterInstance) -> Callable[..., World]:
    """Makes the test's world: `world_of(customers=5)`."""
    return lambda customers=5: World(instance, customers)
