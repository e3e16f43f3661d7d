"""The benchmarks at toy sizes: they run end to end, account for every item, see no duplicate
send, and write JSON with the figures the tables print. Timings are not asserted."""

import json
from datetime import timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from benchmarks import (
    celery_scale,
    common,
    digest_run,
    e2e,
    floor,
    latency,
    phases,
    scale_out,
    side_by_side,
    ui_launch,
    weeks,
)
from digest_pipeline.domain.periods import Period
from digest_pipeline_tests.conftest import require_postgres_url, require_redis_url
from digest_pipeline_tests.dagster.graph import project


def job_checks() -> int:
    """Every check the weekly job evaluates (each benchmark run must pass them all)."""
    job = project().resolve_job_def("weekly_digest_job")
    return len(job.asset_layer.asset_graph.asset_check_keys)


def load(json_dir: Path, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((json_dir / f"{name}.json").read_text(encoding="utf-8"))
    assert {"benchmark", "at", "cpus", "rows", "options"} <= data.keys()
    assert data["benchmark"] == name
    return data


def assert_clean_run(row: dict[str, Any]) -> None:
    assert row["run_success"], row
    assert row["accounted"] == "ok", row["states"]
    assert row["items"] == row["eligible"] > 0
    assert row["dup_sends"] == 0
    assert row["ledger_double_sends"] == 0
    assert row["checks_passed"] == row["checks_total"] == job_checks(), row["failed_checks"]


def test_e2e_runs_the_real_job_with_both_mailers(tmp_path):
    e2e.run(
        e2e.Options(sizes=[120], backends=["sqlite"], mailers=list(e2e.MAILERS), json_dir=tmp_path)
    )
    rows = load(tmp_path, "e2e")["rows"]
    assert [(r["backend"], r["mailer"]) for r in rows] == [
        ("sqlite", "inproc"),
        ("sqlite", "outbox"),
    ]
    for row in rows:
        assert_clean_run(row)
        # every eligible customer got one send, except the demo's malformed addresses
        assert row["sends"] == row["eligible"] - row["invalid"]
        assert row["states"].get("failed", 0) == row["invalid"]
        assert {"cust_per_s", "stmts_per_cust", "rss_mb", "wall_s"} <= row.keys()
        assert set(row["asset_s"]) == {*common.ASSETS.values(), "checks"}
        assert row["statements"] > 0


def test_postgres_variants_are_reported_as_skipped_without_a_url(tmp_path, monkeypatch):
    monkeypatch.delenv(common.PG_URL_ENV, raising=False)
    e2e.run(e2e.Options(sizes=[50], backends=["postgres"], mailers=["inproc"], json_dir=tmp_path))
    scale_out.run(scale_out.Options(processes=[1, 2], json_dir=tmp_path))
    digest_run.run(digest_run.Options(processes=[1, 2], json_dir=tmp_path))
    for name in ("e2e", "scale_out", "digest_run"):
        rows = load(tmp_path, name)["rows"]
        assert rows
        assert all(r["note"] == common.SKIPPED_PG for r in rows)
    assert [r["executor"] for r in load(tmp_path, "e2e")["rows"]] == [
        "inproc",
        "inproc2",
        "multiprocess",
    ]


def test_e2e_runs_multiprocess_only_on_postgres_with_the_zero_latency_mailer():
    opts = e2e.Options(backends=e2e.BACKENDS, mailers=e2e.MAILERS, executors=e2e.EXECUTORS)
    for executor in ("inproc2", "multiprocess"):
        assert [v for v in e2e._variants(opts) if v[2] == executor] == [
            ("postgres", "inproc", executor)
        ]
    assert common.run_config("multiprocess", 2, "forkserver")["execution"] == {
        "config": {"multiprocess": {"max_concurrent": 2, "start_method": {"forkserver": {}}}}
    }


def test_side_by_side_compares_one_step_per_customer_with_batches(tmp_path):
    side_by_side.run(side_by_side.Options(customers=40, backends=["sqlite"], json_dir=tmp_path))
    data = load(tmp_path, "side_by_side")
    single, batched = data["rows"]
    for row in (single, batched):
        assert_clean_run(row)
    assert single["batches"] == single["eligible"]  # one delivery step per customer
    assert batched["batches"] == 1
    [ratio] = data["ratios"]
    assert {"run_ratio", "delivery_ratio"} <= ratio.keys()


def test_consecutive_weeks_run_on_one_ledger_and_leave_the_earlier_ones_as_they_ended(tmp_path):
    weeks.run(weeks.Options(customers=40, weeks=3, backends=["sqlite"], json_dir=tmp_path))
    data = load(tmp_path, "weeks")
    rows = data["rows"]
    ran = [Period.parse(r["week"]) for r in rows]
    # three consecutive weeks, oldest first, ending with the latest complete one
    assert ran[-1] == common.latest_period(common.bench_now())
    assert [b.starts_at - a.starts_at for a, b in pairwise(ran)] == [timedelta(weeks=1)] * 2
    for row in rows:
        assert_clean_run(row)
    [growth] = data["growth"]
    assert growth["weeks"] == growth["still_accounted"] == 3


def test_latency_reports_throughput_against_the_bound(tmp_path):
    latency.run(
        latency.Options(
            concurrency=[4], latency_ms=2, min_items=80, with_job=True, json_dir=tmp_path
        )
    )
    [row] = load(tmp_path, "latency")["rows"]
    assert row["accounted"] == "ok", row["states"]
    assert row["dup_sends"] == 0
    assert row["sends"] == row["items"] - row["invalid"]
    assert row["bound_per_s"] == 4 / 0.002
    assert {"sends_per_s", "pct_of_bound", "job_sends_per_s", "job_pct_of_bound"} <= row.keys()
    job = row["job"]  # the raw figures of the job's run at the same level
    assert job["run_success"]
    assert job["accounted"] is True, job["states"]
    assert job["mailer_dup_sends"] == job["ledger_double_sends"] == 0


@pytest.mark.timeout(600)  # two `digest run`s, then `dagster dev` and two launches
def test_ui_launch_times_the_ui_against_digest_run_for_the_same_week(tmp_path):
    ui_launch.run(ui_launch.Options(customers=30, json_dir=tmp_path))
    data = load(tmp_path, "ui_launch")
    rows = data["rows"]
    assert [(r["path"], r["executor"], r["pass"]) for r in rows] == [
        ("digest run", "in_process", "first"),
        ("digest run", "in_process", "again"),
        ("ui launch", "in_process", "first"),
        ("ui launch", "in_process", "again"),
    ]
    for row in rows:
        assert row["status"] == "SUCCESS", row.get("errors")
        assert row["accounted"] == "ok", row["verdict"]
        assert row["dup_sends"] == 0
        assert row["wall_s"] > 0
        assert row["run_s"] is not None
    # both shops are the same: the first pass sends the same messages, the second none
    first = [r for r in rows if r["pass"] == "first"]
    assert first[0]["new_sends"] == first[1]["new_sends"] > 0
    assert all(r["new_sends"] == 0 for r in rows if r["pass"] == "again")
    assert {(r["executor"], r["pass"]) for r in data["ratios"]} == {
        ("in_process", "first"),
        ("in_process", "again"),
    }


def test_duplicate_detection_is_not_vacuous(tmp_path):
    (tmp_path / "keys-1-1.txt").write_text("digest:2026-W42:customer-0001\n", encoding="utf-8")
    (tmp_path / "keys-2-1.txt").write_text(
        "digest:2026-W42:customer-0001\ndigest:2026-W42:customer-0002\n", encoding="utf-8"
    )
    assert common.key_log_duplicates(tmp_path) == (3, 1)


@pytest.mark.parametrize(
    ("size", "previous", "expected"),
    [
        (100_000, None, 100_000),
        (100_000, {"wall_s": 10.0, "customers": 10_000}, 100_000),  # fits: 100 s
        (100_000, {"wall_s": 100.0, "customers": 10_000}, 30_000),  # 300 s budget: 30,000
    ],
)
def test_e2e_caps_a_size_that_would_not_fit_the_budget(size, previous, expected):
    assert e2e._capped(size, previous, 300.0) == expected


@pytest.mark.integration
def test_the_celery_rows_account_for_every_send_with_no_duplicate(tmp_path):
    require_redis_url()
    require_postgres_url()
    celery_scale.run(
        celery_scale.Options(
            workers=[2], customers=150, batch_size=40, concurrency=4, json_dir=tmp_path
        )
    )
    [row] = load(tmp_path, "celery_scale")["rows"]
    assert row.get("note", "-") == "-", row
    assert row["sends"] == row["sent_attempts"] > 0
    assert (row["mailer_dup_sends"], row["ledger_double_sends"]) == (0, 0)
    assert row["batches"] == row["expected_batches"] > 1
    assert row["workers_used"] >= 1


@pytest.mark.integration
def test_the_digest_run_rows_fork_helpers_only_when_asked(tmp_path):
    require_postgres_url()
    digest_run.run(digest_run.Options(processes=[1, 2], customers=400, json_dir=tmp_path))
    one, two = load(tmp_path, "digest_run")["rows"]
    for row in (one, two):
        assert (row["accounted"], row["dup_sends"]) == ("ok", 0), row
        assert row["messages"] > 0
    # the console script, progress line and all, forks a helper in every batch step
    assert one["forked_steps"] == 0
    assert one["helper_private_mb"] is None
    assert two["forked_steps"] == two["batches"] > 0
    # memory is sampled every 0.3 s, which a helper of a 400-customer week may end inside
    if two["helper_private_mb"] is not None:
        assert 0 < two["helper_private_mb"] <= two["helper_rss_mb"]


def one_postgres_row(tmp_path: Path, executor: str, customers: int) -> dict[str, Any]:
    """The e2e row of one PostgreSQL run with the zero-latency mailer, checked clean."""
    require_postgres_url()
    opts = e2e.Options(
        sizes=[customers],
        backends=["postgres"],
        mailers=["inproc"],
        executors=[executor],
        json_dir=tmp_path,
    )
    e2e.run(opts)
    [row] = load(tmp_path, "e2e")["rows"]
    assert_clean_run(row)
    return dict(row)


@pytest.mark.integration
def test_the_two_process_row_runs_the_job_with_a_delivery_helper(tmp_path):
    row = one_postgres_row(tmp_path, "inproc2", 400)
    # the helper was a child of the run's process, and its sends were counted from its file
    assert row["rss_children_mb"] > 0
    assert row["sends"] == row["eligible"] - row["invalid"]


@pytest.mark.integration
def test_a_postgres_row_counts_what_the_server_ran_and_dagsters_event_rows(tmp_path):
    row = one_postgres_row(tmp_path, "inproc", 150)
    # pg_stat_statements is preloaded by scripts/pg-test-cluster.sh: a count, not a skip
    assert row["server_statements"] >= row["server_transactions"] > 0
    assert row["srv_stmts_per_cust"] > 0
    # Dagster's events for the steps (about seven a step) and three for each check (planned,
    # output, evaluation: a check may share its asset's step), and no line per item
    assert row["eligible"] > 100
    assert 0 < row["event_rows"] < 10 * row["steps"] + 3 * row["checks_total"]


@pytest.mark.integration
def test_the_sql_floor_takes_every_item_of_a_week_to_cleaned(tmp_path):
    require_postgres_url()
    floor.run(floor.Options(customers=500, chunk=120, json_dir=tmp_path))
    [row] = load(tmp_path, "floor")["rows"]
    # every item claimed, attempted, recorded sent and cleaned, chunk after chunk
    assert row["cleaned"] == row["customers"] == 500
    # the sitting's Python speed beside its SQL floor
    assert row["compose_us"] > 0


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.integration)]
)
def test_the_phases_account_for_every_item_and_name_the_statements_waited_on(backend, tmp_path):
    if backend == "postgres":
        require_postgres_url()
    phases.run(phases.Options(customers=300, backends=[backend], json_dir=tmp_path))
    data = load(tmp_path, "phases")
    rows = data["rows"]
    assert [r["phase"] for r in rows] == [
        "snapshot",
        "content",
        "work items",
        "deliveries",
        "cleanup",
    ]
    assert all(r["accounted"] == "ok" and r["cpu_s"] > 0 for r in rows), rows
    # every phase that reads or moves items waited on the ledger, and says on which statements
    waited = {s["phase"] for s in data["statements"] if s["calls"] > 0}
    assert waited >= {"snapshot", "content", "work items", "deliveries", "cleanup"}
