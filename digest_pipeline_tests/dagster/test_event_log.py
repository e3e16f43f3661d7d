"""Nothing a run stores (events, log lines, metadata, check results, tags, step keys) holds an
address or a line of digest content: those stay in the ledger and the message."""

from datetime import timedelta

import dagster as dg

from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline_tests.builders import email_of, key_of
from digest_pipeline_tests.dagster.harness import PRODUCTS, product_title, sweep

CUSTOMERS = 6


def stored_text(instance: dg.DagsterInstance, run_id: str) -> str:
    run = instance.get_run_by_id(run_id)
    assert run is not None
    parts = [dg.serialize_value(run.tags), run.job_name]
    parts += [dg.serialize_value(entry) for entry in instance.all_logs(run_id)]
    return "\n".join(parts)


def test_no_address_or_digest_content_reaches_the_event_log(world_of):
    world = world_of(CUSTOMERS)
    world.mailer.script(key_of(2), SendOutcome.failed(FailureClass.PERMANENT, "smtp:550"))
    world.mailer.script(key_of(3), SendOutcome.failed(FailureClass.TRANSIENT, "smtp:451"))
    world.mailer.script_timeout_after_accept(key_of(4))
    world.composer.fail_for("customer-0005")
    runs = [world.materialize().run_id]
    world.clock.advance(timedelta(hours=2))
    [request] = sweep(world).run_requests
    runs.append(world.materialize(selection=["digest_deliveries", "digest_cleanup"]).run_id)

    # the content did exist and did reach the provider: the scan below is not vacuous
    sent_text = "\n".join(m.text for m in world.mailer.sent_messages)
    assert product_title(0) in sent_text or product_title(1) in sent_text
    assert email_of(1) in {m.recipient for m in world.mailer.sent_messages}
    secrets = [email_of(n) for n in range(1, CUSTOMERS + 1)]
    secrets += [product_title(i) for i in range(PRODUCTS)]
    secrets += ["@mailbox.example", "Celadon Teapot"]
    for run_id in runs:
        text = stored_text(world.instance, run_id)
        assert "digest:2026-W42:customer-0002" in text  # keys are fine, and they are there
        leaked = [s for s in secrets if s in text]
        assert leaked == [], f"run {run_id} stored {leaked}"
    assert all("@" not in v for v in request.tags.values())
