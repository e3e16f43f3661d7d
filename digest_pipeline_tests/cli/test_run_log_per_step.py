"""Dagster's run log holds a few lines per step, never one per work item, whatever fails.

Every line written to the event log is a row in Dagster's storage (on PostgreSQL, one insert
each), so a week of 100,000 failures must not write 100,000 lines there. The per-item record is
the ledger's: the attempts, the dead letters and the audit log.
"""

import dagster as dg

from digest_pipeline.adapters.clock import SystemClock
from digest_pipeline.domain.periods import DEFAULT_INSTANCE
from digest_pipeline.rigs.servers.provider_actions import status
from digest_pipeline.rigs.servers.provider_server import ProviderServer
from digest_pipeline_tests.cli.conftest import Cli

CUSTOMERS = 120


def test_a_week_where_every_send_fails_writes_no_line_per_item_to_the_run_log(env, monkeypatch):
    # every send refused permanently, and the breaker off so the run goes through every item
    with ProviderServer(fallback=status(422, "validation_error")) as provider:
        run_env = {
            **env,
            "DIGEST_MAILER": "http",
            "DIGEST_PROVIDER_URL": provider.url,
            "DIGEST_PROVIDER_API_KEY": provider.api_key,
            "DIGEST_BREAKER_THRESHOLD": "0",
            "DIGEST_LOG_LEVEL": "INFO",
        }
        for name, value in run_env.items():  # the Dagster job's resources read os.environ
            monkeypatch.setenv(name, value)
        digest = Cli(run_env, SystemClock())
        assert digest("seed", "--customers", str(CUSTOMERS), "--seed", "3").code == 0
        run = digest("run", "--period", "latest")
        assert run.code in (0, 1), run.err
        failed = provider.requests
    # the failures happened, and each one was logged per item where an operator reads it
    assert failed > CUSTOMERS // 2
    assert run.err.count("event=attempt_recorded") >= failed

    instance = dg.DagsterInstance.from_config(env["DAGSTER_HOME"])
    try:
        [record] = instance.get_runs()
        entries = instance.all_logs(record.run_id)
        steps = {e.step_key for e in entries if e.step_key is not None}
        lines = [e.user_message for e in entries if e.dagster_event is None]
    finally:
        instance.dispose()
    assert steps, "the run executed no step"
    # the service lines that belong to the run are there (the snapshot gate, the batches) ...
    assert any("event=" in line for line in lines), lines
    # ... but no line is about one item, and there are at most a few per step
    assert [line for line in lines if f"{DEFAULT_INSTANCE}:" in line] == []
    assert len(lines) <= 3 * len(steps), lines
