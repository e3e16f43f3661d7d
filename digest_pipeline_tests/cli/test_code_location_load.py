"""A code location that does not load is one line and exit 2 from `digest run`, not a traceback.

An adopter merges the digest into their own code location; their definitions' error is theirs
to read, in the line that names the location and the error.
"""

import subprocess
import sys
from pathlib import Path

from digest_pipeline_tests.conftest import hermetic_environ

WORKSPACE = """load_from:
  - python_module:
      module_name: broken.definitions
      working_directory: .
      location_name: broken
"""
#: two @definitions functions in one module scope: Dagster refuses to load it
DEFINITIONS = """import dagster as dg
from digest_pipeline.definitions import defs as digest_defs


@dg.definitions
def defs():
    return digest_defs()
"""


def test_a_code_location_that_does_not_load_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "broken" / "definitions.py").write_text(DEFINITIONS, encoding="utf-8")
    (tmp_path / "workspace.yaml").write_text(WORKSPACE, encoding="utf-8")
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n", encoding="utf-8")
    env = hermetic_environ() | {
        "DIGEST_DATABASE_URL": f"sqlite:///{tmp_path / 'ledger.db'}",
        "DAGSTER_HOME": str(tmp_path / "dagster_home"),
        "DIGEST_UNSUBSCRIBE_SECRET": "c" * 64,
        "DIGEST_UNSUBSCRIBE_URL": "https://shop.example/u/{customer_id}?token={token}",
        "DIGEST_POSTAL_ADDRESS": "Shop Ltd, 1 High Street, Town",
        "DIGEST_FROM_ADDRESS": "digest@shop.example",
    }
    digest = Path(sys.executable).parent / "digest"

    done = subprocess.run(
        [str(digest), "run", "--period", "latest"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    # beside the progress line, one line says why
    [line] = [line for line in done.stderr.splitlines() if line.startswith("digest run:")]
    assert line.startswith(
        "digest run: error: code location broken (workspace.yaml) does not load: "
        "DagsterInvariantViolationError: Cannot have more than one function decorated"
    )
