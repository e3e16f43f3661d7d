"""Bad input to any `digest` command is refused before Dagster (seconds to load) is imported.

The invariant is read from a fresh interpreter's `sys.modules` after `main` returned exit code 2,
never from a timing, which a loaded machine would make flaky. The cases run in turn in that one
interpreter, each in a folder of its own, other commands first: the first failing case is the
one that loaded Dagster, and every case after it fails too.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from digest_pipeline.cli.context import EXIT_USAGE
from digest_pipeline.domain.periods import FIRST_PERIOD

PROJECT = Path(__file__).resolve().parents[2]
#: a week whose delivery window closed long before any real clock's now
MISSED = str(FIRST_PERIOD)
LATE = ["--period", MISSED, "--deliver-late", "--reason", "scheduler down"]
BOTH_FILES = ("dagster.yaml", "workspace.yaml")
#: runs `main` for each case read from stdin; writes each one's exit code, stderr and the
#: Dagster modules loaded once it returned
WRAPPER = """
import io, json, sys
from pathlib import Path
from digest_pipeline.cli import main
reports = {}
for case in json.load(sys.stdin):
    err = io.StringIO()
    code = main(case["argv"], env=case["env"], root=Path(case["root"]), out=io.StringIO(), err=err)
    loaded = [m for m in sys.modules if m == "dagster" or m.startswith(("dagster.", "dagster_"))]
    reports[case["id"]] = {"code": code, "dagster": sorted(loaded)[:3], "err": err.getvalue()}
json.dump(reports, sys.stdout)
"""
#: an importtime line (`import time: self | cumulative | name`) of Dagster or a plugin of it
DAGSTER_IMPORT = re.compile(r"^import time:.*\|\s*dagster(\.|_|$)", re.MULTILINE)

#: id -> (argv, extra environment, project files in the folder, what the refusal says)
CASES: dict[str, tuple[list[str], dict[str, str], tuple[str, ...], str]] = {
    "replay-missing-keys-file": (
        ["replay", "--period", MISSED, "--keys-file", "keys.txt", "--reason", "x"],
        {},
        BOTH_FILES,
        "keys.txt",
    ),
    "regenerate-bad-period": (
        ["regenerate", "--period", "2026-W99", "--reason", "fixed"],
        {},
        BOTH_FILES,
        "not an ISO week",
    ),
    "sweep-bad-argument": (["sweep", "--period", MISSED], {}, BOTH_FILES, "unrecognized"),
    "serve-bad-port": (["serve", "--port", "eighty"], {}, BOTH_FILES, "--port"),
    "status-bad-period": (["status", "--period", "2026-W99"], {}, BOTH_FILES, "not an ISO week"),
    "run-bad-period": (["run", "--period", "2026-W99"], {}, BOTH_FILES, "not an ISO week"),
    "run-unreadable-period": (["run", "--period", "soon"], {}, BOTH_FILES, "neither an ISO week"),
    "run-missed-week": (["run", "--period", MISSED], {}, BOTH_FILES, "delivery window closed"),
    "run-late-without-reason": (
        ["run", "--period", MISSED, "--deliver-late"],
        {},
        BOTH_FILES,
        "needs --reason",
    ),
    "run-stray-reason": (
        ["run", "--period", MISSED, "--reason", "x"],
        {},
        BOTH_FILES,
        "--reason is only used with --deliver-late",
    ),
    "run-stray-operator": (
        ["run", "--period", MISSED, "--operator", "alice"],
        {},
        BOTH_FILES,
        "--operator is only used with --deliver-late",
    ),
    "regenerate-bad-reason-on-an-empty-ledger": (
        ["regenerate", "--period", MISSED, "--reason", "fixed\x1b[2J"],
        {},
        BOTH_FILES,
        "--reason holds a control",
    ),
    "run-bad-reason": (
        ["run", "--period", MISSED, "--deliver-late", "--reason", "down\x1b[2J"],
        {},
        BOTH_FILES,
        "--reason holds a control",
    ),
    "run-bad-operator": (
        ["run", *LATE, "--operator", "a\x01"],
        {},
        BOTH_FILES,
        "--operator holds a control",
    ),
    "run-operator-not-allowed": (
        ["run", *LATE, "--operator", "eve"],
        {"DIGEST_OPERATORS": "alice"},
        BOTH_FILES,
        "may not act",
    ),
    "run-bad-instance-storage": (
        ["run", "--period", MISSED],
        {"DAGSTER_PG_URL": "postgresql://dagster@127.0.0.1/dagster"},
        BOTH_FILES,
        "DAGSTER_PG_URL must name",
    ),
    "run-no-dagster-yaml": (
        ["run", "--period", MISSED],
        {},
        ("workspace.yaml",),
        "no dagster.yaml in",
    ),
    "run-no-workspace-yaml": (
        ["run", "--period", MISSED],
        {},
        ("dagster.yaml",),
        "no workspace.yaml in",
    ),
}


def environment(home: Path, **extra: str) -> dict[str, str]:
    # DIGEST_* are already dropped for every test (conftest); no outside Dagster instance either
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_")}
    return env | {"DAGSTER_HOME": str(home / "dagster_home")} | extra


def project(folder: Path, files: tuple[str, ...]) -> Path:
    """`folder` with copies of the named project files; a command's ledger goes into it."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in files:
        shutil.copy(PROJECT / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every case's report, from one fresh interpreter."""
    base = tmp_path_factory.mktemp("refusals")
    cases = []
    for case_id, (argv, extra, files, _) in CASES.items():
        root = project(base / case_id, files)
        cases.append(
            {"id": case_id, "argv": argv, "env": environment(root, **extra), "root": str(root)}
        )
    done = subprocess.run(
        [sys.executable, "-c", WRAPPER],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        cwd=base,
        env=environment(base),
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, dict[str, Any]] = json.loads(done.stdout)
    return found


@pytest.mark.parametrize("case_id", list(CASES))
def test_bad_input_is_refused_before_dagster_is_imported(reports, case_id):
    report, says = reports[case_id], CASES[case_id][3]

    assert (report["code"], report["dagster"]) == (EXIT_USAGE, []), report["err"]
    assert says in report["err"]


def test_the_console_script_refuses_a_bad_period_without_importing_dagster(tmp_path):
    # the installed entry point itself, as an operator types it; PYTHONPROFILEIMPORTTIME is
    # `-X importtime` for a script: every module it imports is a line on stderr
    script = shutil.which("digest", path=str(Path(sys.executable).parent))
    assert script is not None, "the `digest` console script is not installed"
    cwd = project(tmp_path, BOTH_FILES)
    done = subprocess.run(
        [script, "run", "--period", "2026-W99", "--operator", "x y"],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=environment(cwd, PYTHONPROFILEIMPORTTIME="1"),
        timeout=120,
        check=False,
    )

    assert done.returncode == EXIT_USAGE
    assert "digest run: error: 2026-W99 is not an ISO week" in done.stderr
    assert "| digest_pipeline.cli" in done.stderr  # the profile is on: the check is not vacuous
    assert DAGSTER_IMPORT.findall(done.stderr) == []
