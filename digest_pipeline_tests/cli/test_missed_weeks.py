"""A missed week (its window closed before any attempt) through `digest run` and `digest sweep`.

`digest run` refuses it with one line and exit 2, recording nothing, unless the operator grants a
late window with `--deliver-late --reason`, which is audited and then delivers the week. The
Dagster job's resources run on the real clock, so the weeks are picked relative to today.
"""

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from digest_pipeline.adapters.sql.engine import create_ledger_engine
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.cli.context import os_user
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.domain.unsubscribe import DEMO_UNSUBSCRIBE_SECRET
from digest_pipeline.services.link_secrets import require_secret
from digest_pipeline_tests.builders import seed_period
from digest_pipeline_tests.cli.conftest import digest, dump

PROJECT = Path(__file__).resolve().parents[2]
#: ended 15-21 days ago: its default 7-day window closed over a week ago
MISSED = Period.of((datetime.now(UTC) - timedelta(days=21)).date())
LATEST = Period.of((datetime.now(UTC) - timedelta(days=7)).date())


def ledger_dump(env: dict[str, str]) -> dict[str, list[tuple[object, ...]]]:
    engine = create_ledger_engine(env["DIGEST_DATABASE_URL"])
    try:
        return dump(engine)
    finally:
        engine.dispose()


@pytest.fixture
def seeded(env: dict[str, str]) -> dict[str, str]:
    assert digest(env, "seed", "--customers", "12", "--seed", "4", "--period", str(MISSED))[0] == 0
    return env


def test_a_missed_week_is_refused_in_one_line_and_nothing_is_recorded(seeded):
    before = ledger_dump(seeded)

    code, out, err = digest(seeded, "run", "--period", str(MISSED))

    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert f"period {MISSED}" in err
    assert "before any digest was attempted" in err
    assert f"digest run --period {MISSED} --deliver-late --reason TEXT" in err
    assert ledger_dump(seeded) == before


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--deliver-late"], "--deliver-late needs --reason TEXT"),
        (["--deliver-late", "--reason", "  "], "--deliver-late needs --reason TEXT"),
        (["--reason", "why"], "--reason is only used with --deliver-late"),
        (["--operator", "ops-anna"], "--operator is only used with --deliver-late"),
    ],
)
def test_a_late_run_needs_a_reason_and_a_reason_needs_a_late_run(seeded, extra, message):
    before = ledger_dump(seeded)
    code, _, err = digest(seeded, "run", "--period", str(MISSED), *extra)
    assert (code, err.count("\n")) == (2, 1)
    assert message in err
    assert ledger_dump(seeded) == before


def test_a_late_grant_is_refused_while_the_window_is_open(seeded):
    before = ledger_dump(seeded)
    code, _, err = digest(
        seeded, "run", "--period", str(LATEST), "--deliver-late", "--reason", "why"
    )
    assert code == 2
    assert "--deliver-late is not needed" in err
    assert ledger_dump(seeded) == before


def test_an_operator_may_send_a_missed_week_late_and_it_is_audited(seeded, tmp_path):
    # the OS user may act as ops-anna (DIGEST_OPERATORS grants it); both names are audited
    actor = f"ops-anna (os:{os_user()})"
    code, _, err = digest(
        {**seeded, "DIGEST_OPERATORS": f"ops-anna={os_user()}"},
        "run",
        "--period",
        str(MISSED),
        "--deliver-late",
        "--reason",
        "scheduler was down",
        "--operator",
        "ops-anna",
    )

    assert code == 0, err
    assert f"late delivery granted by {actor}" in err
    engine = create_ledger_engine(seeded["DIGEST_DATABASE_URL"])
    try:
        ledger = SqlLedger(engine)
        counts = ledger.state_counts(MISSED)
        [grant] = [e for e in ledger.audit_log(MISSED) if e.action == "deliver_late"]
    finally:
        engine.dispose()
    assert (grant.actor, grant.reason) == (actor, "scheduler was down")
    sent = counts.get(DeliveryState.CLEANED, 0)
    assert sent > 0
    assert set(counts) <= {DeliveryState.CLEANED, DeliveryState.FAILED}
    assert len(list((tmp_path / "outbox" / "new").iterdir())) == sent

    # once attempted, the week is no longer "missed": a plain re-run is allowed, sends nothing
    again = digest(seeded, "run", "--period", str(MISSED))
    assert again[0] == 0, again[2]
    assert len(list((tmp_path / "outbox" / "new").iterdir())) == sent


def test_the_operators_list_applies_to_late_runs(seeded):
    env = {**seeded, "DIGEST_OPERATORS": "ops-anna"}
    before = ledger_dump(seeded)
    code, _, err = digest(
        env, "run", "--period", str(MISSED), "--deliver-late", "--reason", "x", "--operator", "bob"
    )
    assert code == 2
    assert "may not act" in err
    assert ledger_dump(seeded) == before


def test_a_sweep_leaves_a_missed_week_alone_and_says_so(seeded):
    # work items exist (a run crashed after enqueue, say) but nothing was ever attempted
    engine = create_ledger_engine(seeded["DIGEST_DATABASE_URL"])
    try:
        seed_period(SqlLedger(engine), 3, period=MISSED, now=MISSED.ends_at)
        # a sweep records its secret's fingerprint on first use; its refusal of the week is the point
        require_secret(SqlLedger(engine), DEMO_UNSUBSCRIBE_SECRET, MISSED.ends_at, what="sweep")
    finally:
        engine.dispose()
    before = ledger_dump(seeded)

    code, _, err = digest(seeded, "sweep")

    assert code == 1
    assert f"refused: period {MISSED}" in err
    assert ledger_dump(seeded) == before


def test_status_names_a_missed_week_with_the_line_a_run_would_be_refused_with(seeded):
    code, _, refusal = digest(seeded, "run", "--period", str(MISSED))
    assert code == 2

    code, out, _ = digest(seeded, "status", "--period", str(MISSED), "--json")
    assert code == 0
    missed = json.loads(out)["missed"]
    assert missed is not None
    assert missed in refusal

    code, out, _ = digest(seeded, "status", "--period", str(MISSED))
    assert f"MISSED: {missed}" in out.splitlines()


def test_status_of_a_week_whose_window_is_open_names_no_missed_week(seeded):
    code, out, _ = digest(seeded, "status", "--period", str(LATEST), "--json")

    assert code == 0
    assert json.loads(out)["missed"] is None
    code, out, _ = digest(seeded, "status", "--period", str(LATEST))
    assert "MISSED" not in out
