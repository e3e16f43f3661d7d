"""What the operator-command tests share: the week, key spellings, and how a refusal is checked."""

from collections.abc import Sequence

from digest_pipeline.domain.periods import Period
from digest_pipeline_tests.builders import key_of
from digest_pipeline_tests.cli.conftest import (
    Run,
    World,
)

P = "2026-W42"
W41 = Period(2026, 41)
COMMANDS = ["items", "dead-letters", "reconcile", "resolve", "replay", "sweep", "audit"]


def k(n: int) -> str:
    return str(key_of(n))


def replay_argv(
    period: str, *keys: object, reason: str = "OPS-7 mailbox fixed", operator: str = "alice"
) -> list[str]:
    argv = ["replay", "--period", period, "--reason", reason, "--operator", operator]
    for key in keys:
        argv += ["--key", str(key)]
    return argv


def assert_refused(run: Run, command: str, *fragments: str) -> None:
    """Exit 2, nothing on stdout, one line `digest <command>: error: …` naming each fragment."""
    assert run.code == 2, run
    assert run.out == ""
    assert run.err.count("\n") == 1, run.err
    assert run.err.startswith(f"digest {command}: error: ")
    for fragment in fragments:
        assert fragment in run.err


def refused_changes_nothing(
    world: World,
    command: str,
    *argv: str,
    says: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> Run:
    """Runs a command that must be refused; every table and the outbox stay as they were."""
    before, files = world.dump(), world.outbox_files()
    run = world.cli(command, *argv, env=env)
    assert_refused(run, command, *says)
    assert world.dump() == before
    assert world.outbox_files() == files
    return run
