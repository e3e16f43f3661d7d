"""What an analyst sees in the UI after a week's run, read through the webserver's GraphQL API.

One real run of the project's weekly job for 2026-W42 goes into a SQLite DAGSTER_HOME made by
`prepare_home`; then the real `dagster-webserver` serves that home and the project's
`workspace.yaml` on loopback, and the test asks the queries the UI asks (the asset's
materialisations by partition, the asset's checks with their partition statuses, and one
check's executions for a partition, as in the UI's `AssetCheckPartitionDetailQuery`).
"""

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from digest_pipeline.instance import prepare_home
from digest_pipeline.rigs.bootstrap import PROJECT_ROOT
from digest_pipeline.rigs.servers.webserver import (
    ASSETS,
    PARTITION,
    Webserver,
    check_executions,
    running_webserver,
    seed_week,
)
from digest_pipeline_tests.dagster.harness import metadata
from digest_pipeline_tests.weekly_job import materialize_week

DELIVERIES = {"path": ["digest_deliveries"]}

WORKSPACE = """
query Workspace {
  workspaceOrError {
    __typename
    ... on Workspace {
      locationEntries {
        name
        locationOrLoadError {
          __typename
          ... on PythonError { message }
        }
      }
    }
    ... on PythonError { message }
  }
}
"""

MATERIALIZATIONS = """
query Materializations($assetKey: AssetKeyInput!, $partitions: [String!]) {
  assetOrError(assetKey: $assetKey) {
    __typename
    ... on Asset {
      assetMaterializations(partitions: $partitions) {
        runId
        partition
        metadataEntries {
          label
          __typename
          ... on IntMetadataEntry { intValue }
          ... on FloatMetadataEntry { floatValue }
          ... on TextMetadataEntry { text }
        }
      }
    }
  }
}
"""

ASSET_NODE = """
query AssetNode($assetKey: AssetKeyInput!) {
  assetNodeOrError(assetKey: $assetKey) {
    __typename
    ... on AssetNode {
      isPartitioned
      partitionDefinition { type name }
      partitionKeysByDimension { name partitionKeys }
      assetChecksOrError {
        __typename
        ... on AssetChecks {
          checks {
            name
            blocking
            executionForLatestMaterialization { runId status partition }
            partitionStatuses {
              __typename
              ... on AssetCheckTimePartitionStatuses {
                ranges { startKey endKey status }
              }
            }
          }
        }
      }
    }
  }
}
"""


def metadata_values(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {e["label"]: e.get("intValue", e.get("floatValue", e.get("text"))) for e in entries}


@pytest.fixture
def served_week(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[dg.ExecuteInProcessResult, Webserver]]:
    """One week materialised into a SQLite DAGSTER_HOME, then the webserver serving it."""
    env = seed_week(tmp_path / "ledger")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    home = prepare_home(PROJECT_ROOT, {}, tmp_path / "home")
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        result = materialize_week(instance)
    finally:
        instance.dispose()
    assert result.success
    server_env = {**os.environ, **env, "DAGSTER_HOME": str(home)}
    with running_webserver(server_env, tmp_path / "logs") as server:
        yield result, server


def test_the_ui_shows_the_weeks_materialization_metadata_and_check_results(
    served_week: tuple[dg.ExecuteInProcessResult, Webserver],
) -> None:
    result, server = served_week
    [location] = server.graphql(WORKSPACE)["workspaceOrError"]["locationEntries"]
    assert location["name"] == "digest_pipeline"
    assert location["locationOrLoadError"]["__typename"] == "RepositoryLocation", location

    # the asset's materialisation for the partition, with the numbers the Plots tab draws
    asset = server.graphql(MATERIALIZATIONS, {"assetKey": DELIVERIES, "partitions": [PARTITION]})
    [mat] = asset["assetOrError"]["assetMaterializations"]
    assert (mat["runId"], mat["partition"]) == (result.run_id, PARTITION)
    shown = metadata_values(mat["metadataEntries"])
    expected = metadata(result, "digest_deliveries")
    assert shown["eligible"] == expected["eligible"] > 0
    assert shown["sent"] == expected["sent"] > 0
    assert shown["period"] == "2026-W42"
    for name in ASSETS:
        other = server.graphql(
            MATERIALIZATIONS, {"assetKey": {"path": [name]}, "partitions": [PARTITION]}
        )
        assert len(other["assetOrError"]["assetMaterializations"]) == 1, name

    # the partitions definition, and the partition among its keys
    node = server.graphql(ASSET_NODE, {"assetKey": DELIVERIES})["assetNodeOrError"]
    assert node["isPartitioned"]
    assert node["partitionDefinition"]["type"] == "TIME_WINDOW"
    [dimension] = node["partitionKeysByDimension"]
    assert PARTITION in dimension["partitionKeys"]

    # every check on the asset: listed, passed for the week in its partition status, in the
    # execution the checks table shows, and in the check's executions for the partition
    verdicts = {
        e.check_name: e
        for e in result.get_asset_check_evaluations()
        if e.asset_key == dg.AssetKey("digest_deliveries")
    }
    checks = {c["name"]: c for c in node["assetChecksOrError"]["checks"]}
    assert (
        set(checks)
        == set(verdicts)
        == {
            "no_silent_timeout",
            "every_customer_has_visible_state",
            "no_duplicate_send",
            "every_due_item_attempted",
            "stale_items",
            "dead_letter_volume",
            "complaint_rate",
        }
    )
    assert all(v.passed for v in verdicts.values())  # a clean week: nothing failed or warned
    for name, check in checks.items():
        assert check["blocking"] == (verdicts[name].severity is dg.AssetCheckSeverity.ERROR)
        latest = check["executionForLatestMaterialization"]
        assert latest == {"runId": result.run_id, "status": "SUCCEEDED", "partition": PARTITION}
        ranges = check["partitionStatuses"]["ranges"]
        assert {"startKey": PARTITION, "endKey": PARTITION, "status": "SUCCEEDED"} in ranges
        [execution] = check_executions(server, "digest_deliveries", name, PARTITION)
        assert execution["runId"] == result.run_id
        assert (execution["status"], execution["partition"]) == ("SUCCEEDED", PARTITION)
        evaluation = execution["evaluation"]
        assert (evaluation["success"], evaluation["partition"]) == (True, PARTITION)
        assert evaluation["description"].startswith("2026-W42: "), evaluation

    # the catalogue warning sits on digest_content, and the seeded catalogue is clean
    content = server.graphql(ASSET_NODE, {"assetKey": {"path": ["digest_content"]}})
    [catalogue] = content["assetNodeOrError"]["assetChecksOrError"]["checks"]
    assert (catalogue["name"], catalogue["blocking"]) == ("catalogue_products_valid", False)
    assert catalogue["executionForLatestMaterialization"] == {
        "runId": result.run_id,
        "status": "SUCCEEDED",
        "partition": PARTITION,
    }
