"""A provider's spent quota pauses the week through `digest`: items stay due, nobody fails.

Against the loopback provider with a daily quota smaller than the week: the run ends with one
line naming the quota, a sweep inside the pause asks the provider nothing, and no item is
`failed` or dead-lettered for a limit of the shop's account.
"""

from digest_pipeline.adapters.clock import SystemClock
from digest_pipeline.adapters.sql.engine import create_ledger_engine
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.rigs.servers.provider_server import ProviderServer
from digest_pipeline_tests.cli.conftest import Cli

CUSTOMERS = 30
QUOTA = 8


def test_a_spent_quota_pauses_the_week_with_one_line_and_fails_nobody(env, monkeypatch):
    with ProviderServer(daily_quota=QUOTA) as provider:
        run_env = {
            **env,
            "DIGEST_MAILER": "http",
            "DIGEST_PROVIDER_URL": provider.url,
            "DIGEST_PROVIDER_API_KEY": provider.api_key,
            "DIGEST_CONCURRENCY": "1",
            # the week's window outlasts the quota's pause whatever the hour: in the last hour
            # before the default window closes, the paused attempt's retry would fall after it
            "DIGEST_DELIVERY_WINDOW_SECONDS": str(14 * 86400),
        }
        for name, value in run_env.items():  # the Dagster job's resources read os.environ
            monkeypatch.setenv(name, value)
        digest = Cli(run_env, SystemClock())
        assert digest("seed", "--customers", str(CUSTOMERS), "--seed", "3").code == 0
        run = digest("run", "--period", "latest")
        asked = provider.stats().requests
        sweep = digest("sweep")
        assert provider.stats().requests == asked  # inside the pause: nothing asked
    assert run.code != 0
    # the failed step's one line, as `digest run` reports a failed step
    [paused] = [line for line in run.out.splitlines() if "sending paused until" in line]
    assert "http:429:daily_quota_exceeded" in paused
    assert sweep.code == 1
    [stopped] = [line for line in sweep.err.splitlines() if line.startswith("stopped:")]
    assert "daily_quota_exceeded" in stopped

    engine = create_ledger_engine(env["DIGEST_DATABASE_URL"], create=False)
    try:
        ledger = SqlLedger(engine)
        [period] = ledger.open_periods()
        states = [i.state for i in ledger.items(period)]
    finally:
        engine.dispose()
    delivered = {DeliveryState.SENT, DeliveryState.CLEANED}  # the sweep cleans what was sent
    assert sum(s in delivered for s in states) == QUOTA
    # the rest wait for the quota: due again, never failed or dead-lettered
    assert set(states) <= delivered | {DeliveryState.PENDING, DeliveryState.RETRY_SCHEDULED}
