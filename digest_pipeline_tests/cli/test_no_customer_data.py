"""No address, no digest content and no secret reaches anything an operator or a log reads.

A demo period with a mix of failures (permanent, transient into a dead letter, timeouts after
acceptance, and the demo's malformed addresses) is delivered partly by a worker and then by the
project's Dagster job through `digest run`. Then every command runs, as text and as JSON, with
DEBUG logs, including sweeps through an SMTP relay and an HTTP provider that refuse connections.
Every CLI output, every service log record, every work-item, attempt, dead-letter and audit row
and every Dagster event, tag and metadata value is searched for every customer address, every
digest row's title and links, the SMTP password and the provider's API key.
"""

import logging
from pathlib import Path

import dagster as dg
from sqlalchemy import Engine, select

from digest_pipeline.adapters.clock import SystemClock
from digest_pipeline.adapters.mail.outbox import OutboxMailer
from digest_pipeline.adapters.sql.engine import create_ledger_engine
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.adapters.sql.schema import customers, digest_rows, digest_rows_archive
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.retry import RetryPolicy
from digest_pipeline.rigs.servers.loopback import free_port as closed_port
from digest_pipeline.runtime.executor import executor_for
from digest_pipeline.services.deliver import Deliverer, deliver_due
from digest_pipeline.services.enqueue import enqueue_period
from digest_pipeline.settings import load_settings
from digest_pipeline.wiring import build_composer
from digest_pipeline_tests.cli.conftest import (
    PERMANENT,
    PROJECT,
    TRANSIENT,
    Cli,
    ScriptedMailer,
    dump,
)
from digest_pipeline_tests.fakes import FaultInjectingMailer

SMTP_PASSWORD = "smtp-Pa55word-9f3c1e"
API_KEY = "re_live_3b8e2f0a9c7d41"
UNSUBSCRIBE_SECRET = "unsubscribe-secret-77c2"
#: the ledger tables an operator or a check reads; the snapshot and content rows hold the
#: addresses and content by design, until cleanup
SCANNED_TABLES = ("work_items", "attempts", "dead_letters", "audit_log", "cleanups")


def dagster_text(home: Path) -> str:
    """Every run's tags, job name and stored events (logs, metadata, check results)."""
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        parts = []
        for run in instance.get_runs():
            parts += [dg.serialize_value(run.tags), run.job_name]
            parts += [dg.serialize_value(entry) for entry in instance.all_logs(run.run_id)]
        return "\n".join(parts)
    finally:
        instance.dispose()


def deliver_part_with_faults(engine: Engine, env: dict[str, str], period: Period) -> None:
    """A first worker's 30 claims, nine with injected failures, before the run does the rest."""
    clock, ledger = SystemClock(), SqlLedger(engine)
    enqueue_period(ledger, clock, period)
    keys = sorted(OperationKey(period, e.customer_id) for e in ledger.snapshot_entries(period))
    faults = FaultInjectingMailer(OutboxMailer(Path(env["DIGEST_OUTBOX_DIR"])))
    mailer = ScriptedMailer(faults)
    for key in keys[0:3]:
        mailer.script(key, PERMANENT)
    for key in keys[3:6]:
        mailer.script(key, TRANSIENT)
    for key in keys[6:9]:
        faults.timeout_after_accept(key)
    deliverer = Deliverer(
        ledger,
        mailer,
        build_composer(load_settings(env, PROJECT), clock),
        clock,
        DeliveryPolicy(retry=RetryPolicy(max_attempts=1)),  # one transient failure dead-letters
        lambda: 0.5,
        owner="first-worker",
        executor=executor_for(ledger),
    )
    deliver_due(deliverer, batch_size=30, concurrency=2, max_items=30)


def private_strings(engine: Engine) -> list[str]:
    """Every customer address, and every title and link of every generated digest row."""
    with engine.connect() as conn:
        found = list(conn.execute(select(customers.c.email)).scalars())
        for table in (digest_rows, digest_rows_archive):
            for payload in conn.execute(select(table.c.payload)).scalars():
                found += [str(payload[f]) for f in ("title", "url", "image_url") if payload[f]]
    return sorted(set(found))


def test_no_address_content_or_secret_reaches_any_output(tmp_path, monkeypatch, caplog):
    env = {
        "DIGEST_DATABASE_URL": f"sqlite:///{tmp_path / 'digest.db'}",
        "DIGEST_OUTBOX_DIR": str(tmp_path / "outbox"),
        "DAGSTER_HOME": str(tmp_path / "dagster_home"),
        "DIGEST_SMTP_HOST": "127.0.0.1",
        "DIGEST_SMTP_PORT": str(closed_port()),
        "DIGEST_SMTP_SECURITY": "none",
        "DIGEST_SMTP_USERNAME": "digest",
        "DIGEST_SMTP_PASSWORD": SMTP_PASSWORD,
        "DIGEST_PROVIDER_URL": f"http://127.0.0.1:{closed_port()}",
        "DIGEST_PROVIDER_API_KEY": API_KEY,
        "DIGEST_UNSUBSCRIBE_SECRET": UNSUBSCRIBE_SECRET,
        "DIGEST_LOG_LEVEL": "DEBUG",
    }
    for name, value in env.items():  # the Dagster job's resources read os.environ
        monkeypatch.setenv(name, value)
    caplog.set_level(logging.DEBUG, logger="digest_pipeline")
    digest = Cli(env, SystemClock())
    smtp, http = {"DIGEST_MAILER": "smtp"}, {"DIGEST_MAILER": "http"}

    assert digest("seed", "--customers", "80", "--seed", "11", "--period", "latest").code == 0
    period = digest("status", "--period", "latest", "--json").json()["period"]
    engine = create_ledger_engine(env["DIGEST_DATABASE_URL"])
    deliver_part_with_faults(engine, env, Period.parse(period))
    run = digest("run", "--period", period)
    assert run.code == 0, run.err

    every = ["--period", period]
    for argv in (["status", *every], ["items", *every], ["dead-letters", *every], ["audit"]):
        assert digest(*argv).code in (0, 1)
        assert digest(*argv, "--json").code in (0, 1)
    dead = digest("dead-letters", *every, "--json").json()["dead_letters"]
    replayable = [d["key"] for d in dead]
    assert len(replayable) >= 6  # 3 permanent, 3 transient, and the malformed addresses
    for key in replayable[:4]:
        assert digest("items", *every, "--key", key).code == 0
        assert digest("items", *every, "--key", key, "--json").code == 0
    assert digest("reconcile", *every, "--json", env=smtp).code == 0
    assert digest("resolve", "--key", replayable[0], "--as", "sent", "--reason", "x").code == 2

    def replay(keys: list[str], *extra: str) -> None:
        argv = ["replay", *every, "--reason", "OPS-1", *extra]
        assert digest(*argv, *(a for key in keys for a in ("--key", key))).code == 0

    half = len(replayable) // 2
    replay(replayable, "--dry-run")
    replay(replayable, "--dry-run", "--json")
    replay(replayable[:half])
    assert digest("sweep", env=smtp).code == 0  # refused connection: transient, logged
    replay(replayable[half:], "--json")
    assert digest("sweep", "--json", env=http).code == 0
    bad_url = {**http, "DIGEST_PROVIDER_URL": "ftp://127.0.0.1/emails"}
    assert digest("sweep", env=bad_url).code == 2
    for argv in (["items", *every, "--json"], ["audit", "--json"], ["status", *every]):
        assert digest(*argv).code in (0, 1)

    outputs = "\n".join(digest.transcript)
    logged = "\n".join(
        r.getMessage() for r in caplog.records if r.name.startswith("digest_pipeline")
    )
    tables = dump(engine)
    rows = "\n".join(repr(tables[name]) for name in SCANNED_TABLES)
    events = dagster_text(Path(env["DAGSTER_HOME"]))
    private = private_strings(engine)
    engine.dispose()

    # the scan is not vacuous: the content and the addresses exist and reached the outbox,
    # the failures happened, and keys are everywhere
    delivered = b"".join(p.read_bytes() for p in OutboxMailer(tmp_path / "outbox").stored())
    assert sum(s.encode() in delivered for s in private) > 50
    assert "detail=smtp:connect_refused" in outputs  # the relay and the provider were tried
    assert "detail=http:connect_error" in outputs
    assert "detail=invalid_recipient" in outputs  # a malformed demo address
    assert "DEBUG event=" in outputs
    assert "event=attempt_recorded" in logged
    for text in (outputs, logged, rows, events):
        assert f"digest:{period}:" in text
    for name, text in (
        ("CLI output", outputs),
        ("logs", logged),
        ("ledger rows", rows),
        ("Dagster", events),
    ):
        leaked = [s for s in [*private, SMTP_PASSWORD, API_KEY, UNSUBSCRIBE_SECRET] if s in text]
        assert leaked == [], f"{name} holds {leaked[:5]}"
