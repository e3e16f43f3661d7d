"""Concurrent first runs on a fresh DAGSTER_HOME all start.

Each process does what `digest run` does before its run: `prepare_home`, then its own
`DagsterInstance.from_config`. Without the home's lock they would create Dagster's SQLite schema
at once and one would fail (`table alembic_version already exists`, or its UNIQUE constraint).
The processes import Dagster once, then take round after round on a fresh home each, released
together by one line on their stdin: as closely as runs started by one `&` in a shell. A fresh
interpreter per round would spread the starts apart through its imports and rarely hit the race.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
#: fresh homes in turn, each prepared by both processes at once
ROUNDS = 8
PROCESSES = 2
CHILD = """
import json
import sys
from pathlib import Path

import dagster as dg

from digest_pipeline.instance import prepare_home

sys.stdout.write("ready\\n")
sys.stdout.flush()
for line in sys.stdin:
    try:
        home = prepare_home(Path(sys.argv[1]), {}, Path(line.strip()))
        instance = dg.DagsterInstance.from_config(str(home))  # what `digest run` does next
        try:
            instance.get_runs(limit=1)
        finally:
            instance.dispose()
        result = "ok"
    except Exception as e:
        result = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    sys.stdout.write(json.dumps(result) + "\\n")
    sys.stdout.flush()
"""


def test_first_runs_started_together_on_a_fresh_home_all_find_it_ready(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_", "DIGEST_"))}
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(PROJECT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=PROJECT,
        )
        for _ in range(PROCESSES)
    ]
    failures = []
    try:
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline() == "ready\n"
        for n in range(ROUNDS):
            home = tmp_path / f"home-{n}"
            for child in children:
                assert child.stdin is not None
                child.stdin.write(f"{home}\n")
                child.stdin.flush()
            for child in children:
                assert child.stdout is not None
                result = json.loads(child.stdout.readline())
                if result != "ok":
                    failures.append(f"round {n}: {result}")
    finally:
        for child in children:
            if child.stdin is not None:
                child.stdin.close()
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            if child.stdout is not None:
                child.stdout.close()
    assert failures == []
