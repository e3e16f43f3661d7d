"""The database crashes mid-delivery, on a PostgreSQL that keeps its commits: nothing goes out twice.

A `digest sweep` process delivers a week through SMTP to a loopback sink that counts every
message it receives, each reply held back a moment so the crash lands with sends in flight.
`pg_ctl stop -m immediate` stops the database under it; after the restart a second `digest
sweep` and `digest reconcile` finish the week. The sink's own count, not the ledger's, must show
no operation key twice, and the ledger must show every item where an operator can see it.

The suite's cluster (scripts/pg-test-cluster.sh) runs with `fsync` and `synchronous_commit` off
and loses commits in such a crash, so this test starts a durable cluster of its own
(`rigs/servers/pg_cluster.py`). Without PostgreSQL's binaries it skips, and fails under CI.
"""

import os
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from email.parser import BytesHeaderParser
from email.policy import default as default_policy
from pathlib import Path

import pytest

from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.rigs.bootstrap import open_rig_ledger
from digest_pipeline.rigs.seeding import SHOP_LINK_SETTINGS, email_of, seed_period
from digest_pipeline.rigs.servers.pg_cluster import PgCluster, find_binaries
from digest_pipeline_tests.conftest import under_ci
from digest_pipeline_tests.smtp_peer import HangAfterBody, SmtpPeer

CUSTOMERS = 120
#: the sink holds each 250 back this long after storing the message: the crash finds sends
#: whose message arrived but whose outcome the ledger has not recorded
REPLY_DELAY_SECONDS = 0.1
#: messages the sink has when the database is stopped: well inside the week
CRASH_AFTER = CUSTOMERS // 5
LEASE_SECONDS = 1
#: each step's bound: a loaded machine is slow, a hang fails instead of blocking the suite
STEP_TIMEOUT_SECONDS = 90
#: where an operator sees an item once the week is settled: sent, cleaned, or `unknown` with
#: its attempt kept for a lookup or `digest resolve` (the sink cannot be asked)
VISIBLE = {DeliveryState.SENT, DeliveryState.CLEANED, DeliveryState.UNKNOWN}


def require_binaries() -> Path:
    """PostgreSQL's `initdb`/`pg_ctl` folder, or skip (locally) / fail (under CI=true)."""
    found = find_binaries()
    if found is not None:
        return found
    reason = "PostgreSQL's initdb and pg_ctl are not installed (make test installs them)"
    if under_ci():
        pytest.fail(f"integration tier cannot run under CI: {reason}")
    pytest.skip(reason)


def received_keys(peer: SmtpPeer) -> Counter[str]:
    """Messages the sink received, by their `X-Digest-Operation-Key` header."""
    parser = BytesHeaderParser(policy=default_policy)
    return Counter(str(parser.parsebytes(m.raw)["X-Digest-Operation-Key"]) for m in peer.messages)


def digest_env(cluster: PgCluster, peer: SmtpPeer) -> dict[str, str]:
    """This process's environment without `DIGEST_*`, then the week's ledger and SMTP sink.

    No `DIGEST_ALLOW_NONDURABLE_LEDGER`: the durable cluster must pass the check on its own.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIGEST_")}
    return env | {
        "DIGEST_DATABASE_URL": cluster.url,
        "DIGEST_MAILER": "smtp",
        "DIGEST_SMTP_HOST": peer.host,
        "DIGEST_SMTP_PORT": str(peer.port),
        "DIGEST_SMTP_SECURITY": "none",
        "DIGEST_SMTP_TIMEOUT_SECONDS": "10",
        "DIGEST_CONCURRENCY": "4",
        "DIGEST_LEASE_SECONDS": str(LEASE_SECONDS),
        # the latest complete week ended up to 7 days ago: its window stays open through the test
        "DIGEST_DELIVERY_WINDOW_SECONDS": str(14 * 86_400),
        "DIGEST_UNSUBSCRIBE_SECRET": "a-private-secret-for-the-durable-crash-test-0123456789",
        **SHOP_LINK_SETTINGS,
    }


def digest(env: dict[str, str], cwd: Path, *argv: str) -> "subprocess.Popen[str]":
    """`digest ARGV` as a process of its own, its output kept for a failure's message."""
    return subprocess.Popen(
        [sys.executable, "-m", "digest_pipeline.cli", *argv],
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: "subprocess.Popen[str]") -> tuple[int, str]:
    """Waits for the process (killing it past the bound); its exit code and its output."""
    try:
        out, err = process.communicate(timeout=STEP_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"digest did not finish in {STEP_TIMEOUT_SECONDS} s:\n{out}\n{err}")
    return process.returncode, f"{out}\n{err}"


@pytest.mark.integration
def test_a_database_crash_mid_delivery_sends_no_digest_twice(tmp_path):
    binaries = require_binaries()
    now = datetime.now(UTC)
    # the latest complete week, as the chaos harness takes it
    period = Period.of((now - timedelta(days=7)).date())
    with PgCluster(binaries) as cluster, SmtpPeer() as peer:
        cluster.start()
        with open_rig_ledger(cluster.url) as ledger:
            keys = {str(k) for k in seed_period(ledger, CUSTOMERS, period=period, now=now)}
        for n in range(1, CUSTOMERS + 1):
            peer.script(email_of(n), HangAfterBody(REPLY_DELAY_SECONDS))
        env = digest_env(cluster, peer)

        sweep = digest(env, tmp_path, "sweep")
        try:
            deadline = time.monotonic() + STEP_TIMEOUT_SECONDS
            while len(peer.messages) < CRASH_AFTER:
                assert sweep.poll() is None, f"the sweep ended before the crash: {finish(sweep)}"
                assert time.monotonic() < deadline, "the sweep sent too little before the deadline"
                time.sleep(0.01)
            cluster.stop("immediate")
            at_crash = len(peer.messages)
            code, output = finish(sweep)
        finally:
            if sweep.poll() is None:
                sweep.kill()
                sweep.communicate()
        assert code != 0, f"the crash did not reach the sweep:\n{output}"

        cluster.start()  # crash recovery replays the WAL
        time.sleep(LEASE_SECONDS + 0.5)  # the crashed sweep's claims expire
        for argv in (["sweep"], ["reconcile", "--period", str(period)]):
            code, output = finish(digest(env, tmp_path, *argv))
            assert code == 0, output

        received = received_keys(peer)
        with open_rig_ledger(cluster.url) as ledger:
            items = {str(i.key): i for i in ledger.items(period)}
            unknown = [k for k, i in items.items() if i.state is DeliveryState.UNKNOWN]
            attempts = {k: ledger.attempts(items[k].key) for k in unknown}
            failing = [
                r.name for r in ledger.check_invariants(period, datetime.now(UTC)) if not r.passed
            ]

    assert at_crash < CUSTOMERS, "the crash came after the last send"
    assert sum(received.values()) > at_crash, "nothing was delivered after the restart"
    assert {k: n for k, n in received.items() if n > 1} == {}, "digests received twice"
    assert set(received) <= keys
    assert set(items) == keys
    assert {k: i.state for k, i in items.items() if i.state not in VISIBLE} == {}
    # what the ledger reports sent, the sink received (once, as above)
    sent = {k for k, i in items.items() if i.state in (DeliveryState.SENT, DeliveryState.CLEANED)}
    assert {k for k in sent if received[k] != 1} == set()
    # an item left unknown kept the attempt the crash interrupted
    assert {k for k, found in attempts.items() if not found} == set()
    assert failing == []
