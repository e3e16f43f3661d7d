"""The `WeeklyDigest` component: two instances in one code location share no name, and YAML holds
no secret or unknown setting.

Each instance's definitions are built as a code location builds them (`dg.component_defs`); the
example project runs two of them through Dagster (examples/test_own_shop.py).
"""

import dagster as dg
import pytest

from digest_pipeline.component.weekly_digest import WeeklyDigest
from digest_pipeline.setting_values import InvalidSetting
from digest_pipeline_tests.dagster.graph import ASSET_NAMES, project

VIP = "vip_digest"
#: what every step of any instance may require besides its own keys: the outputs of asset
#: checks hold nothing and take Dagster's default I/O manager key (io_manager.py opens nothing
#: for them)
SHARED_KEYS = {"io_manager"}


def build(**attributes: object) -> dg.Definitions:
    return dg.component_defs(component=WeeklyDigest.model_validate(attributes))


@pytest.fixture(scope="module")
def both() -> tuple[dg.Definitions, dg.Definitions]:
    return build(name="digest"), build(name=VIP, database_url="sqlite:///vip.db")


def _names(defs: dg.Definitions) -> dict[str, set[str]]:
    return {
        "assets": {k.to_user_string() for k in defs.resolve_all_asset_keys()},
        "jobs": {j.name for j in defs.jobs or []},
        "schedules": {s.name for s in defs.schedules or []},
        "sensors": {s.name for s in defs.sensors or []},
        "resources": set(defs.resources or {}),
    }


def test_two_instances_merge_into_one_code_location_without_sharing_a_name(both):
    default, vip = both

    merged = dg.Definitions.merge(default, vip)

    dg.Definitions.validate_loadable(merged)
    ours, theirs = _names(default), _names(vip)
    for kind in ours:
        assert ours[kind].isdisjoint(theirs[kind]), kind
        assert all(name.startswith(VIP) for name in theirs[kind]), (kind, theirs[kind])
    assert theirs["assets"] == {f"{VIP}/{name}" for name in ASSET_NAMES}


def test_the_default_instance_keeps_the_names_an_install_already_has(both):
    default, _ = both
    assert _names(default) == _names(project()) | {"resources": _names(default)["resources"]}
    assert {k.to_user_string() for k in default.resolve_all_asset_keys()} == set(ASSET_NAMES)
    assert _names(default)["jobs"] == {"weekly_digest_job"}


def test_every_step_of_an_instance_reads_only_that_instances_resources(both):
    _, vip = both
    job = dg.Definitions.merge(*both).resolve_job_def(f"{VIP}_weekly_digest_job")

    keys = set(job.required_resource_keys)

    assert keys - SHARED_KEYS, "the job requires resources"
    assert all(k.startswith(f"{VIP}_") for k in keys - SHARED_KEYS), sorted(keys)
    assert (keys - SHARED_KEYS) <= set(vip.resources or {})


def test_each_instance_names_its_own_operation_keys_and_ledger(both):
    default, vip = both
    ledger = (vip.resources or {})[f"{VIP}_ledger"]
    assert ledger.instance_settings["DIGEST_INSTANCE"] == VIP
    assert ledger.instance_settings["DIGEST_DATABASE_URL"] == "sqlite:///vip.db"
    assert (default.resources or {})["ledger"].instance_settings == {"DIGEST_INSTANCE": "digest"}


@pytest.mark.parametrize(
    ("attributes", "line"),
    [
        ({"name": "VIP digest"}, "WeeklyDigest name: "),
        ({"settings": {"DIGEST_PROVIDER_API_KEY": "re_123"}}, "DIGEST_PROVIDER_API_KEY may not be"),
        (
            {"settings": {"DIGEST_UNSUBSCRIBE_SECRET": "x" * 32}},
            "DIGEST_UNSUBSCRIBE_SECRET may not",
        ),
        ({"settings": {"DIGEST_INSTANCE": "other"}}, "DIGEST_INSTANCE may not be"),
        ({"settings": {"DIGEST_BATCH_SIZ": "5"}}, r"DIGEST_BATCH_SIZ is not a DIGEST_\* setting"),
        (
            {"templates": "t", "settings": {"DIGEST_TEMPLATE_DIR": "u"}},
            "DIGEST_TEMPLATE_DIR is set twice",
        ),
    ],
)
def test_a_yaml_that_names_a_secret_or_an_unknown_setting_is_refused_in_one_line(attributes, line):
    with pytest.raises(InvalidSetting, match=line) as refused:
        build(**attributes)
    assert "\n" not in str(refused.value)
