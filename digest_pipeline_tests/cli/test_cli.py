"""The `digest` command through `main(argv)`: exit codes, one-line errors, output, idempotence.

Commands run against a real SQLite ledger in a temporary folder; `digest run` drives the project's
own Dagster job in process, with a temporary DAGSTER_HOME.
"""

import io
import json
import re
from pathlib import Path

import pytest
from sqlalchemy import text

from digest_pipeline.adapters.sql.engine import create_ledger_engine
from digest_pipeline.cli import main
from digest_pipeline_tests.cli.conftest import digest

PROJECT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("command", [[], ["seed"], ["run"], ["status"]])
def test_every_command_has_help(env, command, capsys):
    assert digest(env, *command, "--help")[0] == 0
    assert "usage: digest" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["status", "--period", "2026-W54"], "is not an ISO week"),
        (["status", "--period", "2026-10-13"], "not the Monday"),
        (["status", "--period", "garbage"], "neither an ISO week"),
        (["status", "--period", "2999-W01"], "has not ended yet"),
        (["status", "--period", "2024-W10"], "the first week any run has"),
        (["run", "--period", "2026-W54"], "is not an ISO week"),
        (["seed", "--customers", "0"], "--customers must be between 1"),
    ],
)
def test_bad_input_is_one_line_on_stderr_and_exit_code_2(env, argv, message):
    code, out, err = digest(env, *argv)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith(f"digest {argv[0]}: error: ")
    assert message in err


@pytest.mark.parametrize(
    ("name", "value"),
    [("DIGEST_RETRY_MAX_ATTEMPTS", "zero"), ("DIGEST_FROM_ADDRESS", "digest@")],
)
def test_a_bad_setting_is_refused_before_anything_is_written(env, tmp_path, name, value):
    code, _, err = digest({**env, name: value}, "seed", "--customers", "5")
    assert code == 2
    assert name in err
    assert err.count("\n") == 1
    assert not (tmp_path / "digest.db").exists()


def test_seeding_twice_with_the_same_seed_changes_nothing(env):
    first = digest(env, "seed", "--customers", "40", "--seed", "3")
    engine = create_ledger_engine(env["DIGEST_DATABASE_URL"])
    with engine.connect() as conn:
        before = conn.execute(text("SELECT count(*) FROM customers")).scalar_one()
    again = digest(env, "seed", "--customers", "40", "--seed", "3")
    with engine.connect() as conn:
        after = conn.execute(text("SELECT count(*) FROM customers")).scalar_one()
    engine.dispose()
    assert first[0] == again[0] == 0
    assert before == after == 40
    assert first[1] == again[1]


def test_seed_with_a_period_freezes_it_and_status_reports_it_as_json(env):
    assert digest(env, "seed", "--customers", "30", "--period", "latest")[0] == 0
    code, out, _ = digest(env, "status", "--period", "latest", "--json")
    data = json.loads(out)
    assert code == 0
    assert set(data) == {"period", "missed", "by_state", "invariants", "metrics", "dead_letters"}
    assert data["missed"] is None
    assert data["metrics"]["eligible"] > 0
    assert all(v["passed"] for v in data["invariants"].values())
    assert "@" not in out


def test_run_delivers_a_period_and_running_it_again_sends_nothing_new(env, tmp_path):
    assert digest(env, "seed", "--customers", "25", "--seed", "5")[0] == 0
    code, out, err = digest(env, "run", "--period", "latest")
    assert code == 0, err
    outbox = tmp_path / "outbox" / "new"
    sent = sorted(p.name for p in outbox.iterdir())
    assert sent
    assert "succeeded" in out
    assert "no_duplicate_send" in out
    assert "items recorded" in err

    again = digest(env, "run", "--period", "latest")
    assert again[0] == 0
    assert sorted(p.name for p in outbox.iterdir()) == sent
    status = json.loads(digest(env, "status", "--period", "latest", "--json")[1])
    assert set(status["by_state"]) <= {"cleaned", "failed"}
    assert status["by_state"]["cleaned"] == len(sent)


def test_status_exits_1_when_an_invariant_fails(env):
    digest(env, "seed", "--customers", "10", "--period", "latest")
    engine = create_ledger_engine(env["DIGEST_DATABASE_URL"])
    with engine.begin() as conn:
        conn.execute(text("UPDATE eligibility_snapshot SET recipient = 'changed@example.com'"))
    engine.dispose()
    code, out, _ = digest(env, "status", "--period", "latest")
    assert code == 1
    assert re.search(r"^snapshot_unchanged +FAIL", out, re.M)


def test_run_outside_the_project_folder_says_where_to_run_it(env, tmp_path):
    out, err = io.StringIO(), io.StringIO()
    code = main(["run", "--period", "latest"], env=env, root=tmp_path, out=out, err=err)
    assert code == 2
    assert "run digest from the project folder" in err.getvalue()


@pytest.mark.parametrize(
    "argv",
    [
        ["status"],  # a required flag missing
        ["replay", "--period", "latest", "--key", "k", "--max-keys", "many"],  # not a number
        ["no-such-command"],
    ],
)
def test_argument_errors_are_one_line_on_the_commands_stderr(env, argv, capsys):
    code, out, err = digest(env, *argv)
    assert code == 2
    assert out == ""
    assert err.startswith("digest: error: ")
    assert err.count("\n") == 1
    assert capsys.readouterr().err == ""


def test_an_unreachable_database_is_one_line_and_exit_code_1(env):
    unreachable = {**env, "DIGEST_DATABASE_URL": "postgresql+psycopg://u:s3cret@127.0.0.1:1/db"}
    code, _, err = digest(unreachable, "status", "--period", "latest")
    assert code == 1
    assert err.startswith("digest status: error: the ledger database failed: ")
    assert err.count("\n") == 1
    assert "s3cret" not in err
