"""`digest items … | head`: the real console script, its stdout closed by a reader that is done.

The command must end quietly with the SIGPIPE exit status a shell reports for `cat … | head`,
never with a BrokenPipeError traceback. The output is several times a pipe's capacity (64 KiB
on Linux) plus both sides' buffers, so the command is still writing when the reader leaves:
the closed pipe is certain to be hit, not a matter of timing.
"""

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, insert

from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.adapters.sql.schema import audit_log
from digest_pipeline.cli.context import EXIT_OUTPUT_CLOSED
from digest_pipeline.domain.periods import FIRST_PERIOD
from digest_pipeline_tests.builders import seed_period

#: about 150 bytes a line: some 300 KB of output, far past what the pipe can hold unread
ITEMS = 2_000


def console_script() -> str:
    """The installed `digest` entry point next to this interpreter (the venv's bin)."""
    found = shutil.which("digest", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.fail("the `digest` console script is not installed next to the interpreter")
    return found


def first_line_then_close(argv: list[str], url: str, cwd: Path) -> tuple[bytes, str, int]:
    """Runs `digest ARGV` into a reader that closes after one line, as `| head -1` does."""
    env = {**os.environ, "DIGEST_DATABASE_URL": url}
    with subprocess.Popen(
        [console_script(), *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=cwd,
    ) as proc:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        proc.stdout.close()
        _, err = proc.communicate(timeout=60)
    return first, err.decode(errors="replace"), proc.returncode


@pytest.fixture
def ledger_url(sql_engine_factory: Callable[[str], Engine]) -> str:
    """A SQLite ledger with ITEMS work items in the first period (ended by any real clock)."""
    engine = sql_engine_factory("sqlite")
    now = FIRST_PERIOD.ends_at + timedelta(hours=6)
    seed_period(SqlLedger(engine), ITEMS, period=FIRST_PERIOD, now=now, rows_per_customer=1)
    return engine.url.render_as_string(hide_password=False)


@pytest.mark.parametrize(
    ("flags", "first_line"),
    [
        # a table: many small writes
        ((), f"period {FIRST_PERIOD}: {ITEMS} items"),
        # one JSON document: a single write far larger than the pipe
        (("--json",), "{"),
    ],
)
def test_items_into_a_reader_that_stops_after_one_line_ends_quietly(
    ledger_url, tmp_path, flags, first_line
):
    first, stderr, code = first_line_then_close(
        ["items", "--period", str(FIRST_PERIOD), *flags], ledger_url, tmp_path
    )

    assert first.startswith(first_line.encode())
    assert "Traceback" not in stderr
    assert "BrokenPipeError" not in stderr
    assert stderr == ""
    # the status a shell reports for a writer whose reader left: the pipe really was closed
    assert code == EXIT_OUTPUT_CLOSED


@pytest.fixture
def audit_url(sql_engine_factory: Callable[[str], Engine]) -> str:
    """A SQLite ledger with ITEMS audit rows (`digest audit` prints all periods by default)."""
    engine = sql_engine_factory("sqlite")
    at = FIRST_PERIOD.ends_at + timedelta(hours=6)
    rows = [
        {
            "at": at,
            "actor": "alice",
            "action": "resolve",
            "period": str(FIRST_PERIOD),
            "operation_key": f"digest:{FIRST_PERIOD}:customer-{n:05d}",
            "from_state": "unknown",
            "to_state": "sent",
            "reason": f"relay log line {n} says 250 queued",
        }
        for n in range(ITEMS)
    ]
    with engine.begin() as conn:
        conn.execute(insert(audit_log), rows)
    return engine.url.render_as_string(hide_password=False)


@pytest.mark.parametrize(
    ("flags", "first_line"), [((), f"all periods: {ITEMS} audit rows"), (("--json",), "{")]
)
def test_audit_into_a_reader_that_stops_after_one_line_ends_quietly(
    audit_url, tmp_path, flags, first_line
):
    first, stderr, code = first_line_then_close(["audit", *flags], audit_url, tmp_path)

    assert first.startswith(first_line.encode())
    assert stderr == ""  # no BrokenPipeError traceback
    assert code == EXIT_OUTPUT_CLOSED
