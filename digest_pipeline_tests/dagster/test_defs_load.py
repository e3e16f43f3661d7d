"""The project's Definitions load, and hold exactly the graph, checks, schedule and sensor."""

import dagster as dg
import pytest

from digest_pipeline.definitions import defs
from digest_pipeline.domain.model import INVARIANTS
from digest_pipeline_tests.dagster.graph import partitions

ASSET_NAMES = {
    "eligibility_snapshot",
    "digest_content",
    "digest_work_items",
    "digest_deliveries",
    "digest_cleanup",
}
CHECKS_BY_ASSET = {
    ("eligibility_snapshot", "snapshot_unchanged", True),
    ("digest_content", "catalogue_products_valid", False),
    ("eligibility_snapshot", "no_invalid_recipients", False),
    ("digest_deliveries", "no_silent_timeout", True),
    ("digest_deliveries", "every_customer_has_visible_state", True),
    ("digest_deliveries", "no_duplicate_send", True),
    ("digest_deliveries", "every_due_item_attempted", True),
    ("digest_deliveries", "stale_items", False),
    ("digest_deliveries", "dead_letter_volume", False),
    ("digest_deliveries", "complaint_rate", False),
    ("digest_cleanup", "at_most_one_cleanup_per_key", False),
}


@pytest.fixture(scope="module")
def project() -> dg.Definitions:
    return defs()


def test_definitions_are_loadable(project):
    dg.Definitions.validate_loadable(project)


def test_loading_reads_no_setting(monkeypatch):
    # Settings are read when a run starts; a bad value must not break loading the code location.
    monkeypatch.setenv("DIGEST_BATCH_SIZE", "zero")
    monkeypatch.setenv("DIGEST_DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")
    dg.Definitions.validate_loadable(defs())


def test_the_weekly_job_selects_the_five_assets_and_their_checks(project):
    job = project.resolve_job_def("weekly_digest_job")
    graph = job.asset_layer.asset_graph

    assert {k.to_user_string() for k in graph.get_all_asset_keys()} == ASSET_NAMES
    assert {(k.asset_key.to_user_string(), k.name) for k in graph.asset_check_keys} == {
        (a, c) for a, c, _ in CHECKS_BY_ASSET
    }


def test_the_assets_form_one_chain(project):
    graph = project.resolve_asset_graph()
    parents = {
        k.to_user_string(): {p.to_user_string() for p in graph.get(k).parent_keys}
        for k in graph.get_all_asset_keys()
    }
    assert parents == {
        "eligibility_snapshot": set(),
        "digest_content": {"eligibility_snapshot"},
        "digest_work_items": {"digest_content"},
        "digest_deliveries": {"digest_work_items"},
        "digest_cleanup": {"digest_deliveries"},
    }


def test_every_asset_is_in_the_digest_group_partitioned_by_week_and_described(project):
    graph = project.resolve_asset_graph()
    for name in ASSET_NAMES:
        node = graph.get(dg.AssetKey(name))
        assert node.partitions_def == partitions(), name
        assert node.group_name == "digest", name
        assert len(project.resolve_assets_def(name).descriptions_by_key[node.key]) > 40, name


def test_every_check_is_partitioned_by_week_and_blocks_only_where_it_must(project):
    graph = project.resolve_asset_graph()
    found = set()
    for key in graph.asset_check_keys:
        spec = graph.get_check_spec(key)
        assert spec.partitions_def == partitions(), key.name
        assert spec.description, key.name
        found.add((key.asset_key.to_user_string(), key.name, spec.blocking))
    assert found == CHECKS_BY_ASSET


def test_each_check_is_evaluated_by_one_step_its_assets_own_or_one_beside_the_delivery_graph(
    project,
):
    # a step per check cost each Dagster's per-step start and events for a query of milliseconds;
    # the delivery graph's checks cannot share its steps (one run alone must not deliver)
    steps: dict[str, set[str]] = {}
    for d in [*project.assets, *project.asset_checks]:
        for spec in d.check_specs:
            steps.setdefault(d.node_def.name, set()).add(spec.name)
    expected: dict[str, set[str]] = {}
    for asset, name, _ in CHECKS_BY_ASSET:
        step = "digest_deliveries_checks" if asset == "digest_deliveries" else asset
        expected.setdefault(step, set()).add(name)
    assert steps == expected


def test_every_ledger_invariant_has_a_check_of_its_name(project):
    # the operator reads one name in the UI, in `digest status` and in the ledger's report
    names = {key.name for key in project.resolve_asset_graph().asset_check_keys}
    assert set(INVARIANTS) <= names


def test_every_resource_key_is_bound(project):
    assert set(project.resources) == {
        "ledger",
        "customer_source",
        "mailer",
        "composer",
        "clock",
        "delivery",
        # step outputs in the ledger, so no step reads another machine's disk
        "io_manager",
    }


def test_the_sweeper_runs_the_weekly_job_every_five_minutes_and_starts_stopped(project):
    # its requests select delivery and cleanup of the job (test_schedule_and_sensor.py)
    sensor = project.resolve_sensor_def("digest_retry_sweeper")

    assert sensor.minimum_interval_seconds == 300
    assert sensor.default_status == dg.DefaultSensorStatus.STOPPED
    assert sensor.job_name == "weekly_digest_job"
