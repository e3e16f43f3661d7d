"""`digest run`, `sweep` and `serve` refuse a PostgreSQL ledger that can lose commits.

The suite's cluster runs with `fsync` and `synchronous_commit` off (scripts/pg-test-cluster.sh).
Without `DIGEST_ALLOW_NONDURABLE_LEDGER` each command stops with one line naming both settings
(exit 2) and records nothing; with it each goes on: the sweep delivers the week, and `run` and
`serve` reach their next refusal (a missed week, a port in use).
"""

import socket

import pytest

from digest_pipeline.domain.durability import ALLOW_VARIABLE
from digest_pipeline_tests.builders import seed_period
from digest_pipeline_tests.cli.conftest import World

pytestmark = pytest.mark.integration

#: blank is unset (settings read it so); the world's env may carry the cluster's allowance
REFUSED = {ALLOW_VARIABLE: ""}
ALLOWED = {ALLOW_VARIABLE: "1"}
COMMANDS = [["run", "--period", "2026-W42"], ["sweep"], ["serve", "--port", "0"]]


@pytest.fixture
def backend() -> str:
    """Only PostgreSQL reports settings that can lose commits."""
    return "postgres"


@pytest.fixture
def week(world: World) -> World:
    """2026-W42 frozen and enqueued for three customers, nothing sent."""
    seed_period(world.ledger, 3, now=world.clock.now())
    return world


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda argv: argv[0])
def test_a_ledger_that_can_lose_commits_is_refused_in_one_line_and_nothing_recorded(week, argv):
    before = week.dump()

    run = week.cli(*argv, env=REFUSED)

    assert run.code == 2, run.err
    assert run.out == ""
    assert run.err.count("\n") == 1
    assert run.err.startswith(f"digest {argv[0]}: error: digest {argv[0]} refused: ")
    assert "fsync=off and synchronous_commit=off" in run.err
    assert f"{ALLOW_VARIABLE}=1" in run.err
    assert week.dump() == before
    assert week.outbox_files() == []


def test_with_the_allowance_the_sweep_delivers_the_week(week):
    run = week.cli("sweep", env=ALLOWED)

    assert run.code == 0, run.err
    assert len(week.outbox_files()) == 3


def test_with_the_allowance_run_goes_on_to_its_next_check(week):
    # 2026-W30's delivery window closed long before the world's clock: the missed-week refusal
    run = week.cli("run", "--period", "2026-W30", env=ALLOWED)

    assert run.code == 2
    assert "fsync" not in run.err
    assert "2026-W30" in run.err


def test_with_the_allowance_serve_goes_on_to_listen(week):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]

        run = week.cli("serve", "--port", str(port), env=ALLOWED)

    assert run.code == 1
    assert "cannot listen" in run.err
    assert "fsync" not in run.err
