"""`digest run --period latest` when midnight between Sunday and Monday passes during the command.

`latest` is resolved once, at the command's instant, and the window is checked at that same
instant before anything is recorded; a refusal says exactly what the ledger holds of the week.
The job itself is replaced by a stand-in that records which partition it was asked to run (the
real one runs on the system clock), except in the last test, which runs the job's assets on the
test's clock.
"""

import io
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from digest_pipeline.cli import main, workspace_job
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.ports import Clock
from digest_pipeline.wiring import ledger_on
from digest_pipeline_tests.cli.conftest import PROJECT, Run, World
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.dagster.harness import World as JobWorld
from digest_pipeline_tests.dagster.harness import refusal
from digest_pipeline_tests.fakes import FakeLedger, FixedClock

#: Monday 00:00 UTC after 2026-W43: 2026-W42's default window closes then, and `latest` turns
#: from 2026-W42 into 2026-W43
MIDNIGHT = datetime(2026, 10, 26, tzinfo=UTC)
assert DeliveryPolicy().closes_at(W42) == MIDNIGHT


class TickingClock(Clock):
    """A second passes at every reading: a command that reads the clock twice straddles it."""

    def __init__(self, start: datetime) -> None:
        self._next, self._lock = start, threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            now, self._next = self._next, self._next + timedelta(seconds=1)
            return now


@dataclass
class Result:
    """What `digest run` reads of a finished job."""

    success: bool = True
    run_id: str = "stand-in"

    def get_asset_check_evaluations(self) -> list[Any]:
        return []


@dataclass
class StandInJob:
    """`execute_workspace_job`, recording the partitions it was asked to run."""

    partitions: list[str] = field(default_factory=list)

    def __call__(self, instance: Any, workspace: Path, job: str, partition: str, **_: Any) -> Any:
        self.partitions.append(partition)
        return Result()


@pytest.fixture
def job(monkeypatch: pytest.MonkeyPatch) -> StandInJob:
    stand_in = StandInJob()
    monkeypatch.setattr(workspace_job, "execute_workspace_job", stand_in)
    return stand_in


def run_latest(world: World, clock: Clock, tmp_path: Path, **env: str) -> Run:
    out, err = io.StringIO(), io.StringIO()
    code = main(
        ["run", "--period", "latest"],
        env={**world.cli.env, "DAGSTER_HOME": str(tmp_path / "dagster_home"), **env},
        root=PROJECT,
        out=out,
        err=err,
        clock=clock,
    )
    return Run(code, out.getvalue(), err.getvalue())


def test_latest_and_its_window_are_read_at_one_instant_across_midnight(world, job, tmp_path):
    clock = TickingClock(MIDNIGHT - timedelta(seconds=1))

    run = run_latest(world, clock, tmp_path)

    assert run.code == 0, run.err
    assert job.partitions == [W42.partition_key]
    assert run.out.startswith(f"period {W42}: run stand-in succeeded")
    assert clock.now() > MIDNIGHT  # the command did run across midnight


def test_a_refused_latest_records_nothing_and_says_so(world, job, tmp_path):
    # a one-hour window: the latest week's closed long ago, before any attempt
    # the ledger as any command leaves it when it first opens it: its identity names its instance
    ledger_on(world.engine, now=world.clock.now())
    before = world.dump()

    run = run_latest(
        world,
        FixedClock(MIDNIGHT - timedelta(seconds=1)),
        tmp_path,
        DIGEST_DELIVERY_WINDOW_SECONDS="3600",
    )

    assert (run.code, run.out, run.err.count("\n")) == (2, "", 1), run.err
    assert f"period {W42}: its delivery window closed" in run.err
    assert "nothing was recorded" in run.err
    assert job.partitions == []
    assert world.dump() == before  # no snapshot, no items, no grant, no secret fingerprint


class MidnightAfterEnqueue(FakeLedger):
    """The week's window closes right after its items are enqueued, before the delivery step."""

    def __init__(self, clock: FixedClock) -> None:
        super().__init__()
        self._clock = clock

    def enqueue(self, period: Period, now: datetime) -> Any:
        receipt = super().enqueue(period, now)
        self._clock.set(MIDNIGHT + timedelta(seconds=1))
        return receipt


def test_a_window_that_closes_after_the_freeze_is_refused_naming_what_was_recorded(tmp_path):
    clock = FixedClock(MIDNIGHT - timedelta(seconds=4))
    with dg.DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster")) as instance:
        world = JobWorld(instance, customers=3, clock=clock, ledger=MidnightAfterEnqueue(clock))

        result = world.materialize(raise_on_error=False)
        message = refusal(world, result)

    [observation] = result.get_asset_observation_events()
    assert observation.asset_key == dg.AssetKey("digest_deliveries")
    assert "nothing was recorded" not in message
    assert "its snapshot (3 customers) and 3 work items are recorded and kept" in message
    assert "no digest was sent" in message
    assert f"digest run --period {W42} --deliver-late --reason TEXT" in message
    assert world.mailer.sends == 0
    assert sum(world.ledger.state_counts(W42).values()) == 3
