"""Every step opens the run's own ledger or refuses: identity recorded on the run, checked after.

The project's job runs on the real resources (SQLite ledger, outbox mailer) in an ephemeral
instance; a run whose tags name another ledger stands in for a step process on another machine
that was started without (or with the wrong) `DIGEST_DATABASE_URL`.
"""

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest

from digest_pipeline.adapters.demo_data import seed_demo
from digest_pipeline.adapters.sql.engine import create_ledger_engine
from digest_pipeline.adapters.sql.identity import ledger_id, shown_url
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.component.run_ledger import LEDGER_ID_TAG, LEDGER_URL_TAG
from digest_pipeline.definitions import defs
from digest_pipeline.domain.periods import Period
from digest_pipeline_tests.dagster.graph import partitions


@pytest.fixture
def seeded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A seeded SQLite ledger named by DIGEST_DATABASE_URL; returns its URL."""
    url = f"sqlite:///{tmp_path / 'shop' / 'ledger.db'}"
    engine = create_ledger_engine(url)
    seed_demo(engine, customers=8, seed=7, now=datetime.now(UTC))
    engine.dispose()
    monkeypatch.setenv("DIGEST_DATABASE_URL", url)
    monkeypatch.setenv("DIGEST_OUTBOX_DIR", str(tmp_path / "outbox"))
    monkeypatch.setenv("DIGEST_DELIVERY_WINDOW_SECONDS", str(10 * 24 * 3600))
    return url


@pytest.fixture
def instance(tmp_path: Path) -> Iterator[dg.DagsterInstance]:
    with dg.DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster")) as i:
        yield i


def run_week(
    instance: dg.DagsterInstance, tags: dict[str, str] | None = None
) -> dg.ExecuteInProcessResult:
    job = defs().resolve_job_def("weekly_digest_job")
    return job.execute_in_process(
        partition_key=PARTITION, instance=instance, tags=tags, raise_on_error=False
    )


PARTITION = partitions().get_last_partition_key() or ""


def failure_text(result: dg.ExecuteInProcessResult) -> str:
    """Every error the run's events carry (a step's, or the resources' initialisation's)."""
    errors = [getattr(e.event_specific_data, "error", None) for e in result.all_events]
    texts = [err.to_string() for err in errors if err is not None]
    assert texts, "the run should have recorded an error"
    return "\n".join(texts)


def snapshot_of(url: str) -> object:
    engine = create_ledger_engine(url)
    try:
        return SqlLedger(engine).snapshot(Period.parse(PARTITION))
    finally:
        engine.dispose()


def test_a_run_records_the_identity_of_the_ledger_it_opened(seeded, instance):
    result = run_week(instance)

    assert result.success
    tags = instance.get_run_by_id(result.run_id).tags
    engine = create_ledger_engine(seeded)
    try:
        assert tags[LEDGER_ID_TAG] == ledger_id(engine, datetime.now(UTC))
    finally:
        engine.dispose()
    assert tags[LEDGER_URL_TAG] == seeded


def test_a_step_that_opens_another_ledger_refuses_and_changes_nothing(seeded, instance):
    result = run_week(instance, {LEDGER_ID_TAG: "0" * 36, LEDGER_URL_TAG: seeded})

    assert not result.success
    assert "refusing" in failure_text(result)
    assert snapshot_of(seeded) is None


def test_a_step_without_the_database_url_refuses_the_implicit_sqlite(
    seeded, instance, tmp_path, monkeypatch
):
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("DIGEST_DATABASE_URL")
    other = "postgresql://digest:secret@db.internal:5432/ledger"

    result = run_week(instance, {LEDGER_ID_TAG: "0" * 36, LEDGER_URL_TAG: shown_url(other)})

    assert not result.success
    text = failure_text(result)
    assert "DIGEST_DATABASE_URL is not set" in text
    assert "secret" not in text
    assert not (cwd / ".digest").exists(), "no empty ledger may be created"


def test_a_step_never_creates_a_missing_sqlite_file(seeded, instance, tmp_path, monkeypatch):
    missing = tmp_path / "other-disk" / "ledger.db"
    monkeypatch.setenv("DIGEST_DATABASE_URL", f"sqlite:///{missing}")

    result = run_week(instance, {LEDGER_ID_TAG: "0" * 36, LEDGER_URL_TAG: seeded})

    assert not result.success
    assert "refusing to create an empty one" in failure_text(result)
    assert not missing.exists()


def test_the_shown_url_never_carries_the_password():
    assert (
        shown_url("postgresql+psycopg://u:hunter2@h:5432/d")
        == "postgresql+psycopg://u:***@h:5432/d"
    )


def test_the_default_window_keeps_the_latest_week_deliverable():
    # the tests above run "the latest complete week" on the real clock
    assert Period.parse(PARTITION).ends_at + timedelta(days=10) > datetime.now(UTC)
