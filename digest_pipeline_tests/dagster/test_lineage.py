"""Lineage from the team's data: the assets `DIGEST_SOURCE_CONFIG` names are the digest's parents.

The definitions read the config when they load, so each case loads them in a process of its own.
"""

import json
import subprocess
import sys
from pathlib import Path

from digest_pipeline_tests.conftest import hermetic_environ

PROBE = """
import json, dagster as dg
from digest_pipeline.definitions import defs
graph = defs().resolve_asset_graph()
print(json.dumps({
    name: sorted(p.to_user_string() for p in graph.get(dg.AssetKey(name)).parent_keys)
    for name in ("eligibility_snapshot", "digest_content")
}))
"""


def _parents(tmp_path: Path, config: str | None) -> dict[str, list[str]]:
    env = hermetic_environ()
    env.pop("DIGEST_SOURCE_CONFIG", None)
    if config is not None:
        (tmp_path / "shop.yaml").write_text(config, encoding="utf-8")
        env["DIGEST_SOURCE_CONFIG"] = str(tmp_path / "shop.yaml")
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    parents: dict[str, list[str]] = json.loads(done.stdout.splitlines()[-1])
    return parents


def test_the_snapshot_and_content_depend_on_the_assets_that_write_their_records(tmp_path):
    config = (
        "customers: {table: users, asset: shop/users}\n"
        "orders: {query: 'SELECT * FROM purchases', asset: purchases}\n"
    )

    parents = _parents(tmp_path, config)

    assert parents == {
        "eligibility_snapshot": ["shop/users"],
        # products name no asset: only the orders' writer joins the snapshot
        "digest_content": ["eligibility_snapshot", "purchases"],
    }


def test_without_a_source_config_the_digest_has_no_parent_outside_itself(tmp_path):
    assert _parents(tmp_path, None) == {
        "eligibility_snapshot": [],
        "digest_content": ["eligibility_snapshot"],
    }
