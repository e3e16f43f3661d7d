"""`digest reconcile` and `digest sweep` under another mailer than the one that made an attempt.

An SMTP relay stored a digest and then hung past the timeout: the item is `unknown`. A later
process configured with the outbox asks the outbox nothing about it (its "not found" says
nothing of what the relay stored), sends nothing, and says in one line which mailer the item
needs.
"""

from digest_pipeline.adapters.mail.outbox import OutboxMailer
from digest_pipeline.adapters.mail.smtp import SmtpMailer
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.settings import SmtpSettings
from digest_pipeline_tests.builders import key_of, seed_period, state_of
from digest_pipeline_tests.cli.conftest import ScriptedMailer

P = "2026-W42"
RELAY = SmtpMailer(SmtpSettings("relay.example", 587, "digest", None, "starttls", 30.0)).identity
TIMEOUT_AFTER_SEND = SendOutcome.failed(FailureClass.UNKNOWN, "smtp:timeout_after_data")


class RelayMailer(ScriptedMailer):
    """The relay of the first run: every send times out after the message left."""

    @property
    def identity(self) -> str:
        return RELAY


def test_reconcile_and_sweep_under_the_outbox_leave_the_relays_unknown_items_alone(world):
    seed_period(world.ledger, 3, now=world.clock.now())
    relay = RelayMailer(OutboxMailer(world.outbox_dir / "unused"))
    relay.outage = TIMEOUT_AFTER_SEND
    world.deliver(relay)
    assert {state_of(world.ledger, key_of(n)) for n in (1, 2, 3)} == {DeliveryState.UNKNOWN}

    reconciled = world.cli("reconcile", "--period", P)
    swept = world.cli("sweep")

    assert (reconciled.code, swept.code) == (0, 0)
    for run in (reconciled, swept):
        [line] = [x for x in run.out.splitlines() if "left alone" in x]
        assert f"{P}: 3 unknown item(s) left alone" in line
        assert f"made through mailer {RELAY}" in line
    assert {state_of(world.ledger, key_of(n)) for n in (1, 2, 3)} == {DeliveryState.UNKNOWN}
    assert world.outbox_files() == []
    status = world.cli("status", "--period", P, "--json").json()
    assert status["invariants"]["no_duplicate_send"]["passed"] is True
