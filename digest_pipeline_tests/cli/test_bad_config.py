"""Bad configuration is one line and exit code 2, and leaves the disk as it was.

The cases: an infinite duration (an OverflowError traceback if unchecked), a lease of 1e12
seconds (accepted, it would crash a delivery step), MySQL and an in-memory SQLite URL, and
`digest status` on a mistyped SQLite path, which must not create the folder and an empty ledger
and report a healthy week.
"""

from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from digest_pipeline.adapters.sql.engine import (
    create_ledger_engine,
    head_revision,
    migrate,
    schema_revision,
)
from digest_pipeline_tests.cli.conftest import digest

KEY = "digest:2026-W42:customer-1"
#: every command that reads or operates on an existing ledger, with valid arguments
READERS = [
    ["status", "--period", "latest"],
    ["items", "--period", "latest"],
    ["dead-letters", "--period", "latest"],
    ["audit"],
    ["reconcile", "--period", "2026-W42"],
    ["resolve", "--key", KEY, "--as", "sent", "--reason", "checked the provider"],
    ["replay", "--period", "2026-W42", "--key", KEY, "--reason", "provider fixed"],
    ["sweep"],
]


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _one_line_exit_2(code: int, out: str, err: str, command: str) -> str:
    assert code == 2, err
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith(f"digest {command}: error: ")
    return err


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("DIGEST_RETRY_BASE_SECONDS", "inf", "from 0.001 to 86400 (1 day)"),
        ("DIGEST_LEASE_SECONDS", "1e400", "from 1 to 2592000 (30 days)"),
        ("DIGEST_LEASE_SECONDS", "1e12", "from 1 to 2592000 (30 days)"),
        (
            "DIGEST_DATABASE_URL",
            "mysql://shop:s3cret@db.internal/shop",
            "mysql:// is not supported",
        ),
        ("DIGEST_DATABASE_URL", "sqlite:///", "names no SQLite file"),
        ("DIGEST_DATABASE_URL", "sqlite://", "names no SQLite file"),
        # no Dagster asset key or job name could carry it
        ("DIGEST_INSTANCE", "Bad-Name", "must be a lower-case letter followed by at most 21"),
    ],
)
@pytest.mark.parametrize(
    "command", [["status", "--period", "latest"], ["seed", "--customers", "3"]]
)
def test_the_issues_bad_settings_are_one_line_and_change_nothing(
    env, tmp_path, name, value, says, command
):
    code, out, err = digest({**env, name: value}, *command)
    message = _one_line_exit_2(code, out, err, command[0])
    assert name in message
    assert says in message
    assert "s3cret" not in message
    assert _files(tmp_path) == []


def test_a_run_with_a_lease_past_any_clock_is_refused_before_anything_runs(env, tmp_path):
    # before, it was accepted and the delivery step crashed on `now + lease`, items left pending
    code, out, err = digest({**env, "DIGEST_LEASE_SECONDS": "1e12"}, "run", "--period", "latest")
    assert "DIGEST_LEASE_SECONDS" in _one_line_exit_2(code, out, err, "run")
    assert _files(tmp_path) == []


@pytest.mark.parametrize("argv", READERS, ids=lambda argv: argv[0])
def test_a_reader_refuses_a_missing_ledger_and_creates_neither_file_nor_folder(env, tmp_path, argv):
    missing = tmp_path / "nonexistent" / "dir" / "x.db"
    code, out, err = digest({**env, "DIGEST_DATABASE_URL": f"sqlite:///{missing}"}, *argv)
    message = _one_line_exit_2(code, out, err, argv[0])
    assert f"no ledger at {missing}; run digest seed or digest run first" in message
    assert _files(tmp_path) == []


def test_a_missing_ledger_in_an_existing_folder_is_not_created_either(env, tmp_path):
    code, out, err = digest(env, "status", "--period", "latest")  # tmp_path/digest.db
    assert "no ledger at" in _one_line_exit_2(code, out, err, "status")
    assert _files(tmp_path) == []


def test_seed_creates_the_ledger_and_its_folder_and_then_the_readers_open_it(env, tmp_path):
    ledger = tmp_path / "new" / "dir" / "x.db"
    at = {**env, "DIGEST_DATABASE_URL": f"sqlite:///{ledger}"}
    assert digest(at, "seed", "--customers", "3")[0] == 0
    assert ledger.is_file()
    code, _, err = digest(at, "status", "--period", "latest")
    assert code == 0, err


def test_an_engine_that_may_not_create_fails_on_a_missing_file_and_leaves_nothing(tmp_path):
    # the fence behind the readers' check: a file removed between check and open stays gone
    missing = tmp_path / "gone" / "x.db"
    engine = create_ledger_engine(f"sqlite:///{missing}", create=False)
    try:
        with pytest.raises(OperationalError, match="unable to open database file"):
            engine.connect().close()
    finally:
        engine.dispose()
    assert _files(tmp_path) == []


def test_an_engine_that_may_not_create_opens_an_existing_ledger(tmp_path):
    path = tmp_path / "with space" / "x.db"
    made = create_ledger_engine(f"sqlite:///{path}")
    migrate(made)
    made.dispose()
    engine = create_ledger_engine(f"sqlite:///{path}", create=False)
    try:
        assert schema_revision(engine) == head_revision()
    finally:
        engine.dispose()
    assert _files(tmp_path) == ["with space", "with space/x.db"]
