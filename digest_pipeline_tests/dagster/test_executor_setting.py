"""`DIGEST_EXECUTOR` chooses the executor of every job of the code location, and fails closed.

Nothing here needs a cluster or a broker: the Kubernetes run config of `deploy/` is validated
against the job, the Celery worker config as `dagster-celery worker start` reads it, and the
run-settings marks are checked as pure functions. Real Celery workers are in
`integration/test_celery_workers.py`.
"""

import json
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster_celery.cli import get_validated_config

from digest_pipeline.component.run_settings import (
    RUN_SETTINGS_TAG,
    check_run_settings,
    run_settings_tag,
)
from digest_pipeline.definitions import defs
from digest_pipeline.domain.errors import RunSettingsMismatch
from digest_pipeline.executor_settings import load_executor_settings
from digest_pipeline.settings import InvalidSetting

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
BROKER = "redis://127.0.0.1:1/0"


def _jobs(monkeypatch: pytest.MonkeyPatch, **env: str) -> list[dg.JobDefinition]:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    project = defs()
    # the weekly job (schedule, launchpad, `digest run`) and the asset job behind the sensor's
    # asset-selection runs and the UI's "Materialize"
    return [
        project.resolve_job_def("weekly_digest_job"),
        project.resolve_implicit_global_asset_job_def(),
    ]


@pytest.mark.parametrize(
    ("env", "name", "default"),
    [
        ({}, "in_process_or_multiprocess", "in_process"),
        ({"DIGEST_EXECUTOR": "in_process"}, "in_process_or_multiprocess", "in_process"),
        ({"DIGEST_EXECUTOR": "multiprocess"}, "in_process_or_multiprocess", "multiprocess"),
        ({"DIGEST_EXECUTOR": "celery", "DIGEST_CELERY_BROKER_URL": BROKER}, "celery", None),
        ({"DIGEST_EXECUTOR": "k8s"}, "k8s", None),
    ],
)
def test_every_job_runs_on_the_executor_the_setting_names(monkeypatch, env, name, default):
    for job in _jobs(monkeypatch, **env):
        assert job.executor_def.name == name, job.name
        if default is not None:
            chosen = dg.validate_run_config(job, {})["execution"]
            [config] = chosen.values()
            assert list(config) == [default], job.name


def test_the_kubernetes_run_config_of_deploy_validates_against_the_job(monkeypatch):
    [job, _] = _jobs(monkeypatch, DIGEST_EXECUTOR="k8s")
    config = yaml.safe_load((DEPLOY / "k8s-run-config.yaml").read_text())
    validated = dg.validate_run_config(job, config)
    assert validated["execution"]["k8s"]["env_secrets"] == ["digest-secrets"]
    broken = json.loads(json.dumps(config))
    broken["execution"]["config"]["env_secret"] = broken["execution"]["config"].pop("env_secrets")
    with pytest.raises(dg.DagsterInvalidConfigError, match="env_secret"):
        dg.validate_run_config(job, broken)


def test_the_celery_worker_config_of_deploy_reads_the_broker_from_the_environment(monkeypatch):
    monkeypatch.setenv("DIGEST_CELERY_BROKER_URL", BROKER)
    config = get_validated_config(str(DEPLOY / "celery.yaml"))
    assert (config["broker"], config["backend"]) == (BROKER, BROKER)
    assert config["config_source"]["task_acks_late"] is False


@pytest.mark.parametrize(
    ("env", "line"),
    [
        ({"DIGEST_EXECUTOR": "dask"}, "DIGEST_EXECUTOR='dask': must be one of"),
        ({"DIGEST_EXECUTOR": "celery"}, "DIGEST_EXECUTOR=celery needs DIGEST_CELERY_BROKER_URL"),
    ],
)
def test_an_executor_that_cannot_work_is_refused_in_one_line(env, line):
    with pytest.raises(InvalidSetting) as refused:
        load_executor_settings(env)
    assert str(refused.value).startswith(line)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("broker", "backend", "expected"),
    [
        (BROKER, None, BROKER),
        ("amqp://guest@127.0.0.1//", None, "rpc://"),
        (BROKER, "redis://127.0.0.1:2/1", "redis://127.0.0.1:2/1"),
    ],
)
def test_the_celery_result_backend_defaults_to_a_redis_broker_else_rpc(broker, backend, expected):
    env = {"DIGEST_EXECUTOR": "celery", "DIGEST_CELERY_BROKER_URL": broker}
    if backend is not None:
        env["DIGEST_CELERY_BACKEND_URL"] = backend
    assert load_executor_settings(env).celery_backend_url == expected


RUN_ENV = {
    "DIGEST_MAILER": "http",
    "DIGEST_PROVIDER_API_KEY": "re_live_8d7f6e5a4b3c",
    "DIGEST_CELERY_BROKER_URL": "redis://:hunter2-broker@redis.internal:6379/0",
    "DIGEST_DATABASE_URL": "postgresql://u:pw@db/digest",
    "DIGEST_TEST_DATABASE_URL": "postgresql://x@y/z",
    "DIGEST_BATCH_SIZE": "500",
    "DIGEST_LOG_LEVEL": "INFO",
}


def test_the_run_tag_holds_no_secret_and_no_password():
    tag = run_settings_tag(RUN_ENV)[RUN_SETTINGS_TAG]
    for secret in ("re_live_8d7f6e5a4b3c", "hunter2-broker", "pw@db", "http", "500"):
        assert secret not in tag
    assert set(json.loads(tag)) == {
        "DIGEST_MAILER",
        "DIGEST_PROVIDER_API_KEY",
        "DIGEST_CELERY_BROKER_URL",
        "DIGEST_BATCH_SIZE",
    }


def test_the_same_settings_pass_and_the_ledger_url_and_test_variables_are_not_compared():
    recorded = run_settings_tag(RUN_ENV)
    check_run_settings(RUN_ENV, recorded)
    other = {**RUN_ENV, "DIGEST_DATABASE_URL": "postgresql://u@other/digest"}
    other.pop("DIGEST_TEST_DATABASE_URL")
    other.pop("DIGEST_LOG_LEVEL")  # the CLI's own, not a step's
    check_run_settings(other, recorded)
    # another API key is the same mark (present): the provider, not this check, judges it
    check_run_settings({**RUN_ENV, "DIGEST_PROVIDER_API_KEY": "re_other"}, recorded)
    # a run recorded before this check existed (or made by execute_in_process) is not checked
    check_run_settings({}, {})


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"DIGEST_MAILER": None}, "DIGEST_MAILER is not set here"),
        ({"DIGEST_MAILER": "   "}, "DIGEST_MAILER is not set here"),
        ({"DIGEST_BATCH_SIZE": "50"}, "DIGEST_BATCH_SIZE differs"),
        ({"DIGEST_LEASE_SECONDS": "30"}, "DIGEST_LEASE_SECONDS is set here but not in the run"),
        ({"DIGEST_PROVIDER_API_KEY": None}, "DIGEST_PROVIDER_API_KEY is not set here"),
        (
            {"DIGEST_CELERY_BROKER_URL": "redis://:hunter2-broker@other:6379/0"},
            "DIGEST_CELERY_BROKER_URL differs",
        ),
    ],
)
def test_a_step_process_with_other_settings_is_refused_naming_the_variable(change, named):
    here = dict(RUN_ENV)
    for name, value in change.items():
        if value is None:
            here.pop(name)
        else:
            here[name] = value
    with pytest.raises(RunSettingsMismatch) as refused:
        check_run_settings(here, run_settings_tag(RUN_ENV))
    assert named in str(refused.value)
    assert "hunter2" not in str(refused.value)
    assert "re_live" not in str(refused.value)
