"""The benchmarks' targets table: each target judged from the figure that decides it, at its bound,
and never from a benchmark that did not run in the same invocation."""

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from benchmarks import common, tables, targets
from benchmarks.targets import judge, load


def _week(backend: str, executor: str = "inproc", **figures: Any) -> dict[str, Any]:
    return {
        "backend": backend,
        "mailer": "inproc",
        "executor": executor,
        "customers": targets.WEEK,
        "wall_s": 20.0,
        "event_rows": 175,
        "rss_mb": 210.0,
        "rss_children_mb": None,
        "srv_stmts_per_cust": 0.07 if backend == "postgres" else None,
        "accounted": "ok",
        "dup_sends": 0,
        "ledger_double_claims": 0,
        **figures,
    }


def _latency(concurrency: int, service: float, job: float) -> dict[str, Any]:
    return {
        "concurrency": concurrency,
        "pct_of_bound": service,
        "job_pct_of_bound": job,
        "accounted": "ok",
        "dup_sends": 0,
    }


def a_run_meeting_every_target() -> dict[str, dict[str, Any]]:
    return {
        "e2e": {
            "rows": [
                _week("postgres"),
                _week("sqlite", wall_s=25.0),
                _week("postgres", "multiprocess", wall_s=35.0, event_rows=190),
                _week("postgres", customers=targets.LARGE, wall_s=200.0, rss_mb=340.0),
            ]
        },
        "floor": {"rows": [{"customers": targets.WEEK, "total_s": 12.0}]},
        "side_by_side": {
            "rows": [],
            "ratios": [{"backend": "sqlite", "run_ratio": 52.0, "delivery_ratio": 160.0}],
        },
        "latency": {
            "rows": [_latency(16, 85.0, 80.0), _latency(64, 80.0, 72.0), _latency(256, 60.0, 55.0)]
        },
        # no `accounted` cell: judged on its duplicates only
        "celery_scale": {"rows": [{"mailer_dup_sends": 0, "ledger_double_sends": 0}]},
    }


def verdicts(payloads: dict[str, dict[str, Any]]) -> dict[str, bool | None]:
    return {v.target: v.met for v in judge(payloads)}


def test_a_run_within_every_bound_meets_every_target():
    got = verdicts(a_run_meeting_every_target())
    assert len(got) == 12
    assert all(got.values()), got


@pytest.mark.parametrize(
    ("change", "failing"),
    [
        # the targets' bounds: under 30 s, at least 40 %, 50x, 70 / 50 %, 200 rows, 400 MB
        (lambda p: p["e2e"]["rows"][0].update(wall_s=30.0), "on PostgreSQL"),
        (lambda p: p["e2e"]["rows"][1].update(wall_s=30.0), "SQLite no slower"),
        (lambda p: p["floor"]["rows"][0].update(total_s=7.99), "bulk-SQL floor"),
        (lambda p: p["side_by_side"]["ratios"][0].update(run_ratio=49.9), "one step per customer"),
        (lambda p: p["latency"]["rows"][1].update(job_pct_of_bound=69.9), "latency-bound at 64"),
        (lambda p: p["latency"]["rows"][2].update(pct_of_bound=49.9), "latency-bound at 256"),
        (
            lambda p: p["e2e"]["rows"][2].update(event_rows=201),
            "rows per 100,000 customers (multiprocess)",
        ),
        (lambda p: p["e2e"]["rows"][3].update(rss_children_mb=400.0), "peak RSS"),
        (lambda p: p["e2e"]["rows"][3].update(srv_stmts_per_cust=0.51), "server statements"),
        (lambda p: p["e2e"]["rows"][1].update(accounted="FAIL {'claimed': 1}"), "accounted"),
        (
            lambda p: p["celery_scale"]["rows"][0].update(mailer_dup_sends=1),
            "sent or claimed twice",
        ),
        (lambda p: p["e2e"]["rows"][0].update(ledger_double_claims=1), "sent or claimed twice"),
    ],
)
def test_a_figure_past_its_bound_fails_that_target_alone(change, failing):
    payloads = a_run_meeting_every_target()
    change(payloads)
    got = verdicts(payloads)
    assert [t for t, met in got.items() if not met] == [t for t in got if failing in t]
    assert any(failing in t for t in got)


def test_a_figure_at_its_bound_meets_it():
    payloads = a_run_meeting_every_target()
    payloads["floor"]["rows"][0]["total_s"] = 8.0  # exactly 40 % of 20 s
    payloads["side_by_side"]["ratios"][0]["run_ratio"] = 50.0
    payloads["latency"]["rows"][1]["job_pct_of_bound"] = 70.0
    payloads["e2e"]["rows"][2]["event_rows"] = 200
    assert all(verdicts(payloads).values())


def test_a_benchmark_that_did_not_run_leaves_its_targets_unjudged():
    payloads = a_run_meeting_every_target()
    del payloads["floor"], payloads["latency"]
    payloads["e2e"]["rows"].pop()  # no --large
    got = verdicts(payloads)
    unjudged = sorted(t for t, met in got.items() if met is None)
    assert [t.split(":")[0] for t in unjudged] == [
        "1,000,000 customers",
        "1,000,000 customers",
        "at least 40 % of the bulk-SQL floor measured in the same run",
        "latency-bound share of concurrency / latency",
    ]
    assert all(met for met in got.values() if met is not None)


def test_side_by_side_is_judged_only_at_the_targets_size():
    payloads = a_run_meeting_every_target()
    payloads["side_by_side"]["options"] = {"customers": 100}
    payloads["side_by_side"]["ratios"][0]["run_ratio"] = 4.0  # a toy week's ratio
    [side] = [v for v in judge(payloads) if v.target.startswith("one step per customer")]
    assert (side.met, side.measured) == (None, "ran at 100 customers")


def test_only_this_runs_json_is_judged(tmp_path: Path):
    payloads = a_run_meeting_every_target()
    for name, payload in payloads.items():
        tables.write_json(tmp_path, name, payload)
    old = json.loads((tmp_path / "floor.json").read_text(encoding="utf-8"))
    old["at"] = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    (tmp_path / "floor.json").write_text(json.dumps(old), encoding="utf-8")

    since = datetime.now(UTC) - timedelta(hours=1)
    assert sorted(load(tmp_path, since)) == sorted(set(payloads) - {"floor"})
    assert sorted(load(tmp_path)) == sorted(payloads)

    written = targets.report(tmp_path, since)
    table = json.loads((tmp_path / "targets.json").read_text(encoding="utf-8"))["rows"]
    assert [r["target"] for r in table] == [v.target for v in written]
    floor_row = next(r for r in table if "bulk-SQL floor" in r["target"])
    assert floor_row["verdict"] == "not measured"
    # the table's own JSON is never read back as a benchmark's
    assert "targets" not in load(tmp_path)


def _targets_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.targets", *args],
        cwd=common.ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_since_without_an_offset_is_refused_in_one_line(tmp_path: Path):
    done = _targets_cli("--json-dir", str(tmp_path), "--since", "2026-12-06T10:00")
    assert done.returncode == 2
    assert "has no UTC offset" in done.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "targets.json").exists()


def test_a_missing_folder_or_a_broken_file_is_refused_in_one_line(tmp_path: Path):
    missing = tmp_path / "nowhere"
    done = _targets_cli("--json-dir", str(missing))
    assert done.returncode == 2
    assert "is not a folder" in done.stderr.strip().splitlines()[-1]
    assert not missing.exists()

    (tmp_path / "e2e.json").write_text("{not json", encoding="utf-8")
    done = _targets_cli("--json-dir", str(tmp_path))
    assert done.returncode == 2
    assert "e2e.json is not a benchmark's JSON" in done.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "targets.json").exists()
