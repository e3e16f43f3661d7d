"""Fixtures of the Dagster tier: an ephemeral instance per test and a world of fakes around it.

A materialisation costs about a second, so the weeks that several tests only read are
materialised once per session (`clean_week`, `week_with_failures`); a test that changes its
world or runs again takes its own from `world_of`.
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest

from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline_tests.builders import key_of
from digest_pipeline_tests.conftest import hermetic_env
from digest_pipeline_tests.dagster.harness import World

PERMANENT = SendOutcome.failed(FailureClass.PERMANENT, "smtp:550")
TRANSIENT = SendOutcome.failed(FailureClass.TRANSIENT, "smtp:451")


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


@dataclass(frozen=True)
class Materialised:
    """A world after one materialisation of the whole week, and the run's result: read only."""

    world: World
    result: dg.ExecuteInProcessResult


@pytest.fixture(scope="session")
def clean_week(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Materialised]:
    """Five customers, every send succeeds, one materialisation of everything."""
    folder = tmp_path_factory.mktemp("dagster")
    with dg.DagsterInstance.ephemeral(tempdir=str(folder)) as instance:
        world = World(instance, 5)
        with hermetic_env():
            result = world.materialize()
        yield Materialised(world, result)


@pytest.fixture(scope="session")
def week_with_failures(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Materialised]:
    """Five customers: 2 fails permanently, 4 transiently (retry scheduled), the rest are sent."""
    folder = tmp_path_factory.mktemp("dagster")
    with dg.DagsterInstance.ephemeral(tempdir=str(folder)) as instance:
        world = World(instance, 5)
        world.mailer.script(key_of(2), PERMANENT)
        world.mailer.script(key_of(4), TRANSIENT)
        with hermetic_env():
            result = world.materialize()
        yield Materialised(world, result)
