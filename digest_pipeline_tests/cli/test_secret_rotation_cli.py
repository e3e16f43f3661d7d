"""The ledger's recorded unsubscribe secret, from the terminal: refusals and `digest rotate-secret`.

A `digest run`, `sweep` or `serve` whose secret is not the one the ledger recorded, or is under
16 bytes on a real shop's ledger, stops with one line naming `DIGEST_UNSUBSCRIBE_SECRET` (exit 2)
and changes nothing. `digest rotate-secret` reads both secrets from the environment, records the
new one with an audit row, and from then on every command needs the new one; `digest serve`
also needs the rotated-out one while links it signed are still accepted.
"""

import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from digest_pipeline.domain.fingerprints import ROTATE_ACTION, UNSUBSCRIBE, fingerprint
from digest_pipeline_tests.cli.conftest import OS_USER, PRIVATE_SECRET

NEW = "a-new-private-secret-for-cli-tests"
OTHER = "another-private-secret-for-cli-tests"
ROTATION_ENV = {
    "DIGEST_UNSUBSCRIBE_SECRET": NEW,
    "DIGEST_UNSUBSCRIBE_SECRET_PREVIOUS": PRIVATE_SECRET,
}


def _one_line(run, command: str) -> str:
    assert run.code == 2, run.err
    assert run.out == ""
    assert run.err.count("\n") == 1
    assert run.err.startswith(f"digest {command}: error: ")
    for secret in (PRIVATE_SECRET, NEW, OTHER):
        assert secret not in run.err
    return str(run.err)


@contextmanager
def _taken_port() -> Iterator[str]:
    """A port `digest serve` cannot listen on: it then stops with exit 1 after its checks."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        yield str(taken.getsockname()[1])


def _recorded(world) -> str | None:
    record = world.ledger.secret_fingerprints.fingerprint_record(UNSUBSCRIBE)
    return None if record is None else record.current


@pytest.mark.parametrize(
    "argv", [["serve"], ["run", "--period", "2026-W42"], ["sweep"]], ids=lambda a: a[0]
)
def test_a_secret_other_than_the_recorded_one_is_refused_and_changes_nothing(mixed, argv):
    mixed.ledger.secret_fingerprints.record_first_fingerprint(
        UNSUBSCRIBE, fingerprint(PRIVATE_SECRET), mixed.clock.now()
    )
    before, mail = mixed.dump(), mixed.outbox_files()

    line = _one_line(mixed.cli(*argv, env={"DIGEST_UNSUBSCRIBE_SECRET": OTHER}), argv[0])

    assert f"digest {argv[0]} refused: DIGEST_UNSUBSCRIBE_SECRET is not the secret" in line
    assert mixed.dump() == before
    assert mixed.outbox_files() == mail


def test_a_short_secret_is_refused_on_a_real_shops_ledger(mixed):
    before = mixed.dump()

    run = mixed.cli("sweep", env={"DIGEST_UNSUBSCRIBE_SECRET": "fifteen-bytes!!"})

    assert "DIGEST_UNSUBSCRIBE_SECRET is 15 bytes" in _one_line(run, "sweep")
    assert "at least 16 bytes" in run.err
    assert mixed.dump() == before


def test_a_rotation_moves_every_command_to_the_new_secret_and_is_audited(mixed):
    with _taken_port() as port:
        assert mixed.cli("serve", "--port", port).code == 1  # past the checks: recorded
    assert _recorded(mixed) == fingerprint(PRIVATE_SECRET)

    run = mixed.cli("rotate-secret", "--reason", "yearly rotation", env=ROTATION_ENV)

    assert run.code == 0, run.err
    assert run.out.startswith(
        f"unsubscribe secret rotated: fingerprint {fingerprint(PRIVATE_SECRET)[:12]} -> "
        f"{fingerprint(NEW)[:12]}\n"
    )
    assert PRIVATE_SECRET not in run.out + run.err
    assert NEW not in run.out + run.err
    assert _recorded(mixed) == fingerprint(NEW)
    row = mixed.ledger.audit_log()[-1]
    assert (row.action, row.actor) == (ROTATE_ACTION, OS_USER)
    assert row.reason.startswith("yearly rotation [")

    old = mixed.cli("sweep")  # the world's env still holds the rotated-out secret
    assert "DIGEST_UNSUBSCRIBE_SECRET is the secret rotated out" in _one_line(old, "sweep")
    alone = mixed.cli("serve", env={"DIGEST_UNSUBSCRIBE_SECRET": NEW})
    assert "set DIGEST_UNSUBSCRIBE_SECRET_PREVIOUS" in _one_line(alone, "serve")
    with _taken_port() as port:
        both = mixed.cli("serve", "--port", port, env=ROTATION_ENV)
    assert both.code == 1, both.err
    assert "cannot listen" in both.err


@pytest.mark.parametrize(
    ("argv", "env", "says"),
    [
        ([], {"DIGEST_UNSUBSCRIBE_SECRET": NEW}, "set DIGEST_UNSUBSCRIBE_SECRET_PREVIOUS"),
        ([], {**ROTATION_ENV, "DIGEST_UNSUBSCRIBE_SECRET_PREVIOUS": OTHER}, "is not the secret"),
        ([], {}, "already the recorded secret"),
        (["--overlap-weeks", "53"], ROTATION_ENV, "--overlap-weeks must be between 0 and 52"),
        (["--secret", NEW], ROTATION_ENV, "unrecognized arguments"),
    ],
    ids=["no-previous", "wrong-previous", "unchanged", "overlap-too-long", "secret-in-argv"],
)
def test_a_refused_rotation_is_one_line_and_writes_nothing(mixed, argv, env, says):
    mixed.ledger.secret_fingerprints.record_first_fingerprint(
        UNSUBSCRIBE, fingerprint(PRIVATE_SECRET), mixed.clock.now()
    )
    before = mixed.dump()

    run = mixed.cli("rotate-secret", "--reason", "because", *argv, env=env)

    assert run.code == 2, run.err
    assert run.err.count("\n") == 1
    assert says in run.err
    assert mixed.dump() == before


def test_a_rotation_without_overlap_needs_no_previous_secret(mixed):
    mixed.ledger.secret_fingerprints.record_first_fingerprint(
        UNSUBSCRIBE, fingerprint(PRIVATE_SECRET), mixed.clock.now()
    )
    env = {"DIGEST_UNSUBSCRIBE_SECRET": NEW}

    run = mixed.cli("rotate-secret", "--reason", "leaked", "--overlap-weeks", "0", env=env)

    assert run.code == 0, run.err
    assert "no longer accepted" in run.out
    with _taken_port() as port:
        assert mixed.cli("serve", "--port", port, env=env).code == 1
