"""`digest simulate` through `main(argv)`: help, one-line errors with exit code 2, the table on
stdout (the same bytes for the same seed), the JSON and CSV files, and the plot extra."""

import csv
import importlib.util
import io
import json
from pathlib import Path

import pytest

from digest_pipeline.cli import main
from digest_pipeline.domain.model import INVARIANTS
from digest_pipeline.rigs.sim.measure import COLUMNS

PROJECT = Path(__file__).resolve().parents[2]
SMALL = ["simulate", "--customers", "40", "--workers", "1,2", "--lease-seconds", "5", "--jobs", "1"]


def digest(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), env={}, root=PROJECT, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_help_lists_the_flags(capsys):
    assert digest("simulate", "--help")[0] == 0
    text = capsys.readouterr().out
    for flag in (
        "--customers",
        "--transient-rate",
        "--outage-start",
        "--crash-after-cleanup-commit-rate",
        "--no-provider-idempotent",
        "--workers",
        "--lease-seconds",
        "--no-jitter",
        "--retry-base-seconds",
        "--max-age-seconds",
        "--plot",
    ):
        assert flag in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--customers", "0"], "must be at least 1"),
        (["--customers", "many"], "not a whole number"),
        (["--customers", "2000000"], "--customers must be between 1 and"),
        (["--customers", "5", "--transient-rate", "1.5"], "must be between 0 and 1"),
        (["--customers", "5", "--throttle-rate", "nan"], "must be between 0 and 1"),
        (["--customers", "5", "--permanent-rate", "x"], "is not a number"),
        (["--customers", "5", "--transient-rate", "0.6", "--throttle-rate", "0.6"], "at most 1"),
        (["--customers", "5", "--workers", "1,0"], "whole numbers of at least 1"),
        (["--customers", "5", "--workers", "4,4"], "lists a value twice"),
        (["--customers", "5", "--lease-seconds", ""], "whole numbers of at least 1"),
        (["--customers", "5", "--lease-seconds", "5,-3"], "whole numbers of at least 1"),
        (["--customers", "5", "--outage-minutes", "-1"], "must be 0 or more"),
        (["--customers", "5", "--send-latency-ms", "0"], "must be a positive number"),
        (["--customers", "5", "--retry-cap-seconds", "10"], "retry cap must be at least the base"),
        (["--customers", "5", "--max-attempts", "0"], "must be at least 1"),
        (["--customers", "5", "--jobs", "0"], "must be at least 1"),
        (["--customers", "5", "--plot", "grid.jpg"], "--plot must name a .png file"),
        (["--customers", "5", "--json", "/no/such/folder/x.json"], "does not exist"),
        (["--customers", "5", "--database-url", "sqlite:///x.db"], "must be a postgresql://"),
        (["--customers", "5", "--database-url", "not a url"], "not a database URL"),
        (["--customers", "5", "--database-url", "postgresql://h/db", "--jobs", "2"], "--jobs"),
    ],
)
def test_bad_input_is_one_line_on_stderr_and_exit_code_2(argv, message):
    code, out, err = digest("simulate", *argv)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("digest")
    assert message in err


def test_the_table_is_the_same_bytes_for_the_same_seed():
    first, again = digest(*SMALL), digest(*SMALL)
    assert first[0] == again[0] == 0
    assert first[1] == again[1]
    assert "invariants: all 5 hold in every cell" in first[1]
    assert "w1/l5" in first[1]
    assert "w2/l5" in first[1]
    assert "cells in" in first[2]  # the wall time, on stderr only


def test_json_and_csv_files_are_written(tmp_path):
    code, _, _ = digest(
        *SMALL, "--json", str(tmp_path / "r.json"), "--csv", str(tmp_path / "r.csv")
    )
    assert code == 0
    data = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))
    assert data["config"]["customers"] == 40
    assert [c["cell"] for c in data["cells"]] == ["w1/l5", "w2/l5"]
    assert list(data["cells"][0]) == list(COLUMNS)
    assert all(data["cells"][0][f"inv_{n}"] is True for n in INVARIANTS)
    with (tmp_path / "r.csv").open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["cell"] for r in rows] == ["w1/l5", "w2/l5"]
    assert rows[0]["customers"] == "40"


def test_no_jitter_runs_the_grid_again_without_jitter_side_by_side(tmp_path):
    code, out, _ = digest(*SMALL, "--no-jitter", "--csv", str(tmp_path / "r.csv"))
    assert code == 0
    with (tmp_path / "r.csv").open(encoding="utf-8", newline="") as f:
        rows = [(r["cell"], r["jitter"]) for r in csv.DictReader(f)]
    assert rows == [
        ("w1/l5", "True"),
        ("w2/l5", "True"),
        ("w1/l5/nj", "False"),
        ("w2/l5/nj", "False"),
    ]
    assert "w2/l5/nj" in out


def test_plot_without_the_plot_extra_is_a_one_line_error_before_anything_runs(
    tmp_path, monkeypatch
):
    # The dev extra installs matplotlib (so the plot itself is tested); hide it here.
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a, **kw: None if name == "matplotlib" else find_spec(name, *a, **kw),
    )
    code, out, err = digest(*SMALL, "--plot", str(tmp_path / "grid.png"))
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert "pip install 'digest_pipeline[plot]'" in err


def test_plot_draws_a_png(tmp_path):
    code, _, _ = digest(*SMALL, "--plot", str(tmp_path / "grid.png"))
    assert code == 0
    assert (tmp_path / "grid.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
