"""The resources read `DIGEST_*` at run time, with defaults, overrides and `EnvVar` bindings,
and the project's own job runs a week end to end on them (SQLite ledger, outbox mailer)."""

from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest

from digest_pipeline.adapters.demo_data import seed_demo
from digest_pipeline.adapters.sql.engine import create_ledger_engine
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.component.resources import DeliveryResource, LedgerResource
from digest_pipeline.definitions import defs
from digest_pipeline.domain.model import CleanupMode
from digest_pipeline.domain.periods import Period
from digest_pipeline.settings import InvalidSetting, default_database_url
from digest_pipeline_tests.dagster.graph import partitions
from digest_pipeline_tests.dagster.harness import metadata


def test_delivery_settings_have_working_defaults():
    s = DeliveryResource().settings()

    # the embedded outbox's concurrency (settings.DEFAULT_CONCURRENCY)
    assert (s.batch_size, s.concurrency, s.cleanup_mode) == (25_000, 256, CleanupMode.ARCHIVE)
    assert (s.stale_after_seconds, s.dead_letter_rate_threshold) == (6 * 3600, 0.05)


def test_a_step_claims_a_few_waves_at_a_time_never_more_than_its_batch(monkeypatch):
    # a step works through 25,000 items but leases 8 x 256 (the outbox's concurrency) at a
    # time, so no lease outlives its wait behind a slow provider
    assert DeliveryResource().settings().claim_size == 2048
    monkeypatch.setenv("DIGEST_BATCH_SIZE", "7")
    assert DeliveryResource().settings().claim_size == 7


def test_the_environment_is_read_when_the_settings_are_asked_for(monkeypatch):
    resource = DeliveryResource()
    monkeypatch.setenv("DIGEST_BATCH_SIZE", "7")
    monkeypatch.setenv("DIGEST_LEASE_SECONDS", "90")

    s = resource.settings()
    assert (s.batch_size, s.policy.lease) == (7, timedelta(seconds=90))


def test_an_explicit_field_overrides_the_environment(monkeypatch):
    monkeypatch.setenv("DIGEST_BATCH_SIZE", "7")
    assert DeliveryResource(batch_size=3, cleanup_mode="delete").settings().batch_size == 3
    assert DeliveryResource(cleanup_mode="delete").settings().cleanup_mode is CleanupMode.DELETE


def test_a_field_bound_to_an_env_var_is_resolved_at_run_time(monkeypatch):
    monkeypatch.setenv("DIGEST_CONCURRENCY", "4")
    bound = DeliveryResource(concurrency=dg.EnvVar.int("DIGEST_CONCURRENCY"))
    with dg.build_resources({"delivery": bound}) as resources:
        assert resources.delivery.settings().concurrency == 4


def test_a_bad_value_names_its_variable(monkeypatch):
    monkeypatch.setenv("DIGEST_BATCH_SIZE", "0")
    with pytest.raises(InvalidSetting, match="DIGEST_BATCH_SIZE"):
        DeliveryResource().settings()


def test_the_ledger_resource_opens_a_migrated_ledger_and_disposes_of_it(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with dg.build_resources({"ledger": LedgerResource(database_url=url)}) as resources:
        ledger = resources.ledger
        assert isinstance(ledger, SqlLedger)
        assert ledger.open_periods() == []


def outbox_files(root: Path) -> list[Path]:
    return sorted(p for folder in ("new", "cur") for p in (root / folder).glob("*"))


def test_the_weekly_job_runs_a_week_on_the_embedded_defaults(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the defaults live under ./.digest/
    # the real clock decides; keep the week deliverable on whatever day this runs
    monkeypatch.setenv("DIGEST_DELIVERY_WINDOW_SECONDS", str(10 * 24 * 3600))
    engine = create_ledger_engine(default_database_url(tmp_path))
    seeded = seed_demo(engine, customers=12, seed=7, now=datetime.now(UTC))
    engine.dispose()
    partition = partitions().get_last_partition_key()
    assert partition is not None
    job = defs().resolve_job_def("weekly_digest_job")

    with dg.DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster")) as instance:
        first = job.execute_in_process(partition_key=partition, instance=instance)
        second = job.execute_in_process(partition_key=partition, instance=instance)

    deliveries, again = metadata(first, "digest_deliveries"), metadata(second, "digest_deliveries")
    sent = deliveries["sent"]
    eligible = seeded.customers - seeded.inactive - seeded.not_opted_in
    assert deliveries["eligible"] == eligible
    assert sent + deliveries["failed"] == eligible
    assert len(outbox_files(tmp_path / ".digest" / "outbox")) == sent > 0
    assert again["this_run_claimed"] == 0
    assert len(outbox_files(tmp_path / ".digest" / "outbox")) == sent
    ledger_engine = create_ledger_engine(default_database_url(tmp_path))
    try:
        counts = SqlLedger(ledger_engine).state_counts(Period.parse(partition))
    finally:
        ledger_engine.dispose()
    assert sum(counts.values()) == eligible
