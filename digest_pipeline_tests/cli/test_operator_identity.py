"""Who acted, and what the audit trail shows: the OS user beside a claimed operator, and no
control character from `--operator` or `--reason` ever reaching a reader's terminal raw.

`mixed` (cli/conftest.py) has `unknown` items 6 and 7 and dead-lettered or failed items 2..5.
"""

import os
import pwd
import unicodedata
from datetime import UTC, datetime

import pytest
from sqlalchemy import update

from digest_pipeline.adapters.sql.schema import dead_letters
from digest_pipeline.cli import context
from digest_pipeline.domain.model import AuditEntry
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline_tests.builders import key_of
from digest_pipeline_tests.cli.conftest import REAL_OS_USER, World
from digest_pipeline_tests.conftest import W42

P = str(W42)
UNPRINTABLE = {"Cc", "Cf", "Zl", "Zp", "Cs"}
#: what a terminal obeys: clear the screen, return to column 0, red, right-to-left override
HOSTILE = ["\x1b[2J", "\r", "\n", "\x1b]0;title\x07", "\x9b31m", "\u202e", "\u2028", "\x7f"]


def k(n: int) -> str:
    return str(key_of(n))


def resolve(world: World, *extra: str, env: dict[str, str] | None = None, reason: str = "relay"):
    argv = ["resolve", "--key", k(6), "--as", "sent", "--reason", reason, *extra]
    return world.cli(*argv, env=env)


def replay(world: World, *extra: str, env: dict[str, str] | None = None, reason: str = "OPS-7"):
    argv = ["replay", "--period", P, "--key", k(2), "--reason", reason, *extra]
    return world.cli(*argv, env=env)


def actors(world: World) -> list[str]:
    return [r["actor"] for r in world.cli("audit", "--json").json()["audit"]]


def assert_refused_unchanged(world: World, run, command: str, *fragments: str) -> None:
    assert run.code == 2, run
    assert run.out == ""
    assert run.err.startswith(f"digest {command}: error: ")
    assert run.err.count("\n") == 1
    for fragment in fragments:
        assert fragment in run.err


@pytest.fixture
def as_bob(monkeypatch: pytest.MonkeyPatch) -> str:
    """The process runs as OS user `bob`."""
    monkeypatch.setattr(context, "os_user", lambda: "bob", raising=False)  # new: today getpass
    return "bob"


# -- who is acting ------------------------------------------------------------------------------


@pytest.mark.parametrize("listed", [None, "alice", "alice,bob"])
@pytest.mark.parametrize("command", ["resolve", "replay"])
def test_a_claimed_operator_who_is_not_the_os_user_is_refused(mixed, as_bob, listed, command):
    env = {} if listed is None else {"DIGEST_OPERATORS": listed}
    before = mixed.dump()
    act = resolve if command == "resolve" else replay
    run = act(mixed, "--operator", "alice", env=env)
    assert_refused_unchanged(mixed, run, command, "'alice' is not the OS user 'bob'")
    assert mixed.dump() == before


def test_a_granted_claim_is_recorded_with_the_os_user_beside_it(mixed, as_bob):
    env = {"DIGEST_OPERATORS": "alice=bob, carol"}
    run = resolve(mixed, "--operator", "alice", env=env)
    assert run.code == 0, run.err
    assert "resolved by alice (os:bob)" in run.out
    assert replay(mixed, "--operator", "alice", "--json", env=env).json()["operator"] == (
        "alice (os:bob)"
    )
    assert actors(mixed) == ["alice (os:bob)", "alice (os:bob)"]
    # the grant is for bob only: carol may act as herself, not as alice
    assert resolve(mixed, "--operator", "carol", env=env).code == 2


def test_acting_as_yourself_records_just_your_name(mixed, as_bob):
    assert resolve(mixed, "--operator", "bob", env={"DIGEST_OPERATORS": "bob"}).code == 0
    assert replay(mixed, env={"DIGEST_OPERATORS": "bob"}).code == 0
    assert actors(mixed) == ["bob", "bob"]


def test_an_os_user_outside_digest_operators_is_refused_even_without_a_claim(mixed, as_bob):
    run = resolve(mixed, env={"DIGEST_OPERATORS": "alice"})
    assert_refused_unchanged(mixed, run, "resolve", "'bob' may not act")


def test_the_os_user_comes_from_the_uid_not_from_the_environment(mixed, monkeypatch):
    monkeypatch.setattr(context, "os_user", REAL_OS_USER)  # the world runs as "alice"
    real = pwd.getpwuid(os.geteuid()).pw_name
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        monkeypatch.setenv(name, "alice-" + real)  # what getpass.getuser() would believe
    assert resolve(mixed).code == 0
    assert actors(mixed) == [real]


def test_a_malformed_digest_operators_entry_is_one_line(mixed, as_bob):
    run = resolve(mixed, env={"DIGEST_OPERATORS": "alice="})
    assert_refused_unchanged(mixed, run, "resolve", "NAME=OS_USER")


# -- control characters at input ----------------------------------------------------------------


@pytest.mark.parametrize("char", HOSTILE, ids=[ascii(c) for c in HOSTILE])
@pytest.mark.parametrize("command", ["resolve", "replay"])
@pytest.mark.parametrize("flag", ["--operator", "--reason"])
def test_a_control_character_in_operator_or_reason_is_refused(mixed, command, flag, char):
    before = mixed.dump()
    value = f"alice{char}FAKE"
    act = resolve if command == "resolve" else replay
    run = act(mixed, "--operator", value) if flag == "--operator" else act(mixed, reason=value)
    assert_refused_unchanged(mixed, run, command, flag, "control or format character")
    assert char not in run.err.rstrip("\n")
    assert mixed.dump() == before


def test_a_control_character_in_a_late_delivery_reason_is_refused(mixed):
    argv = ["run", "--period", P, "--deliver-late", "--reason", "scheduler\x1b[2J down"]
    run = mixed.cli(*argv)
    assert_refused_unchanged(mixed, run, "run", "--reason", "control or format character")


# -- control characters at output (rows stored by older versions) -------------------------------


@pytest.fixture
def hostile_rows(mixed: World) -> World:
    """An audit row and a dead-letter row as a version without the input check stored them."""
    mixed.ledger.record_audit(
        AuditEntry(
            datetime(2026, 10, 19, 7, tzinfo=UTC),
            "mallory\x1b[2J",
            "resolve",
            key_of(6),
            DeliveryState.UNKNOWN,
            DeliveryState.SENT,
            "ok\r\x1b[32mall clear\u202e\x07",
            W42,
        )
    )
    with mixed.engine.begin() as conn:
        conn.execute(
            update(dead_letters)
            .where(dead_letters.c.operation_key == k(4))
            .values(reason="max\x1b[8m_attempts")
        )
    return mixed


def assert_inert(text: str) -> None:
    """No control or format character but the line ends `ctx.write` puts there."""
    lines = text.split("\n")
    assert not [c for c in "".join(lines) if unicodedata.category(c) in UNPRINTABLE], repr(text)


def test_audit_escapes_control_characters_of_stored_rows(hostile_rows):
    out = hostile_rows.cli("audit", "--period", P).out
    assert_inert(out)
    assert "mallory\\x1b[2J" in out
    assert "ok\\x0d\\x1b[32mall clear\\u202e\\x07" in out
    # --json was always escaped by the JSON encoder; it keeps the stored text exactly
    [entry] = hostile_rows.cli("audit", "--json").json()["audit"]
    assert entry["reason"] == "ok\r\x1b[32mall clear\u202e\x07"


def test_an_items_story_escapes_its_audit_rows(hostile_rows):
    out = hostile_rows.cli("items", "--period", P, "--key", k(6)).out
    assert_inert(out)
    assert "mallory\\x1b[2J" in out


def test_dead_letters_escape_a_stored_reason(hostile_rows):
    out = hostile_rows.cli("dead-letters", "--period", P).out
    assert_inert(out)
    assert "max\\x1b[8m_attempts" in out
    story = hostile_rows.cli("items", "--period", P, "--key", k(4)).out
    assert_inert(story)
    assert "max\\x1b[8m_attempts" in story
