"""A real relay on loopback refuses one mailbox with 550 5.1.1: that customer is suppressed.

The refusal travels the whole path: aiosmtpd's reply, the SMTP mailer's classification
(`smtp:550:5.1.1`, permanent), the deliverer and the SQL ledger's suppression list. A policy
refusal (554 5.7.1) of another customer in the same week suppresses nobody.
"""

from datetime import timedelta

import pytest

from digest_pipeline.adapters.mail.smtp import SmtpMailer
from digest_pipeline.domain.feedback import SuppressionReason
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.rigs.seeding import email_of
from digest_pipeline_tests.builders import (
    deliver_all,
    failed_invariants,
    key_of,
    make_deliverer,
    seed_period,
    state_of,
)
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.smtp_peer import Reply, SmtpPeer

pytestmark = pytest.mark.integration
W43 = Period(2026, 43)


def test_a_relays_refusal_of_a_mailbox_suppresses_its_customer(sql_ledger, clock):
    ledger = sql_ledger
    seed_period(ledger, 3, now=clock.now())
    seed_period(ledger, 3, period=W43, now=clock.now())
    with SmtpPeer() as peer:
        peer.script(email_of(1), Reply(550, "rcpt"))  # 5.1.1 unknown user
        peer.script(email_of(2), Reply(554, "rcpt"))  # 5.7.1 policy
        mailer = SmtpMailer(peer.settings(timeout_seconds=5.0))
        try:
            deliver_all(make_deliverer(ledger, mailer, clock), period=W42)
        finally:
            mailer.close()
        received = {to for m in peer.messages for to in m.rcpt_tos}

    assert received == {email_of(3)}
    assert [state_of(ledger, key_of(n)) for n in (1, 2, 3)] == [
        DeliveryState.FAILED,
        DeliveryState.FAILED,
        DeliveryState.SENT,
    ]
    assert [(s.customer_id, s.reason, s.source) for s in ledger.suppressions()] == [
        (key_of(1).customer_id, SuppressionReason.HARD_BOUNCE, "mailer:smtp:550:5.1.1")
    ]
    assert state_of(ledger, key_of(1, W43)) is DeliveryState.SUPPRESSED
    assert state_of(ledger, key_of(2, W43)) is DeliveryState.PENDING
    clock.advance(timedelta(minutes=1))
    assert failed_invariants(ledger, W42, clock.now()) == []
