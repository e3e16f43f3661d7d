"""Every file `digest` reads is read through one bounded reader (cli/files.py).

`/dev/zero`, a FIFO whose writer never stops and a regular file one byte over the limit are each
refused in one line with exit code 2, reading no more than the limit and one byte, and the
ledger and the outbox stay exactly as they were.
"""

import io
import os
import threading
from pathlib import Path

import pytest

from digest_pipeline.cli import main
from digest_pipeline.cli.files import MAX_INPUT_BYTES
from digest_pipeline.wiring import ledger_on
from digest_pipeline_tests.cli.conftest import World
from digest_pipeline_tests.cli.operator_steps import P, k, refused_changes_nothing

LIMIT = f"more than {MAX_INPUT_BYTES} bytes"


def replay_from(path: object) -> list[str]:
    return ["--period", P, "--reason", "OPS-7", "--operator", "alice", "--keys-file", str(path)]


def padded(size: int, first: str = "") -> bytes:
    """`first`, then comment lines up to exactly `size` bytes: a valid keys file of that size."""
    head = first.encode()
    line = b"# " + b"x" * 61 + b"\n"
    body = line * ((size - len(head)) // len(line) + 1)
    return (head + body)[: size - 1] + b"\n"


@pytest.mark.timeout(30)
def test_a_keys_file_of_dev_zero_is_refused_in_one_line_and_changes_nothing(mixed):
    run = refused_changes_nothing(mixed, "replay", *replay_from("/dev/zero"), says=[LIMIT])
    assert "--keys-file /dev/zero" in run.err


def test_a_keys_file_one_byte_over_the_limit_is_refused_and_changes_nothing(mixed, tmp_path):
    over = tmp_path / "keys.txt"
    over.write_bytes(padded(MAX_INPUT_BYTES + 1, f"{k(2)}\n"))

    run = refused_changes_nothing(mixed, "replay", *replay_from(over), says=[LIMIT])

    assert f"--keys-file {over}" in run.err


def test_a_keys_file_at_the_limit_is_read(mixed, tmp_path):
    full = tmp_path / "keys.txt"
    full.write_bytes(padded(MAX_INPUT_BYTES, f"{k(2)}\n"))
    assert full.stat().st_size == MAX_INPUT_BYTES

    data = mixed.cli("replay", *replay_from(full), "--dry-run", "--json").json()

    assert [line["key"] for line in data["keys"]] == [k(2)]


@pytest.mark.timeout(30)
def test_a_fifo_whose_writer_never_stops_is_refused_and_changes_nothing(mixed, tmp_path):
    fifo = tmp_path / "keys.fifo"
    os.mkfifo(fifo)
    written = [0]

    def write_forever() -> None:
        chunk = padded(64 * 1024)
        try:
            with fifo.open("wb") as pipe:
                while True:
                    pipe.write(chunk)
                    written[0] += len(chunk)
        except BrokenPipeError:  # the reader stopped: what a refusal does
            return

    writer = threading.Thread(target=write_forever, daemon=True)
    writer.start()
    refused_changes_nothing(mixed, "replay", *replay_from(fifo), says=[LIMIT])
    writer.join(timeout=10)

    assert not writer.is_alive()
    # the reader took the limit and a byte, plus what the pipe held: nowhere near unbounded
    assert written[0] < 4 * MAX_INPUT_BYTES


def test_an_oversized_dagster_yaml_is_refused_before_the_run(world: World, tmp_path: Path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "dagster.yaml").write_bytes(b"#" * MAX_INPUT_BYTES + b"\n")
    # the ledger as any command leaves it when it first opens it: its identity names its instance
    ledger_on(world.engine, now=world.clock.now())
    before = world.dump()
    out, err = io.StringIO(), io.StringIO()

    code = main(
        ["run", "--period", P], env=world.cli.env, root=project, out=out, err=err, clock=world.clock
    )

    assert (code, out.getvalue()) == (2, "")
    assert err.getvalue().count("\n") == 1
    assert err.getvalue().startswith(f"digest run: error: dagster.yaml {project / 'dagster.yaml'}")
    assert LIMIT in err.getvalue()
    assert world.dump() == before
