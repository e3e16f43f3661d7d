"""One fault vocabulary, one expected failure class per fault, met by every mailer against its peer.

Each rig (mailer_rigs.py) turns a provider-neutral fault into its peer's own answer; the mailer
must classify it as every other mailer does, the breaker must read only a credential refusal as
one, and the peer's own store must hold nothing for a refusal and exactly one message when the
answer was lost. A fault a peer cannot produce is skipped by name, with the rig's reason. The
fake and the outbox have no peer to fail; their lost answers are in the reconcile suite.
"""

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from digest_pipeline.domain.breaker import as_retryable, credentials_refused
from digest_pipeline.domain.failures import FailureClass
from digest_pipeline.domain.model import Message, message_id_for
from digest_pipeline_tests.builders import email_of, key_of
from digest_pipeline_tests.contract.all_mailer_rigs import PEER_RIGS, RIGS
from digest_pipeline_tests.contract.mailer_rigs import EXPECTED, HELD_AFTER, Fault, MailerRig


@pytest.fixture(params=PEER_RIGS)
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MailerRig]:
    with RIGS[request.param](tmp_path) as opened:
        yield opened


def digest_message(n: int = 1) -> Message:
    """Customer `n`'s digest as the composer makes it: the key's Message-ID and key header."""
    key = key_of(n)
    return Message(
        key=key,
        recipient=email_of(n),
        sender="digest@example.com",
        subject=f"Your digest for {key.period}",
        text="Your picks\n",
        html="<p>Your picks</p>",
        headers=(("Message-ID", message_id_for(key)), ("X-Digest-Operation-Key", str(key))),
    )


@pytest.mark.parametrize("kind", list(RIGS))
def test_every_rig_declares_each_fault_as_produced_or_not_with_a_reason(kind):
    rig = RIGS[kind]
    assert set(rig.answers).isdisjoint(rig.cannot)
    assert set(rig.answers) | set(rig.cannot) == set(Fault)
    assert all(why.strip() for why in rig.cannot.values())


@pytest.mark.parametrize("fault", list(Fault))
def test_a_fault_is_classified_alike_by_every_mailer(rig, fault):
    if fault in rig.cannot:
        pytest.skip(f"{rig.name} cannot produce {fault}: {rig.cannot[fault]}")
    msg = digest_message()
    rig.script(msg.key, fault)

    outcome = rig.mailer().send(msg, idempotency_key=str(msg.key))

    assert (outcome.accepted, outcome.failure_class) == (False, EXPECTED[fault])
    # only a refused credential stops the run and is retried once the sender is fixed
    assert credentials_refused(outcome) is (fault is Fault.CREDENTIAL_REFUSED)
    if fault is Fault.CREDENTIAL_REFUSED:
        assert as_retryable(outcome).failure_class is FailureClass.TRANSIENT
    if fault is Fault.RATE_LIMITED and rig.stated_wait is not None:
        # the provider's wait, read against its own answer's Date (whole seconds)
        assert outcome.retry_after is not None
        assert rig.stated_wait - timedelta(seconds=1) <= outcome.retry_after <= rig.stated_wait
    assert rig.held(msg.key) == HELD_AFTER[fault]


#: the faults that are one answer of the peer, which took nothing (the others are its state)
ONE_ANSWER = [
    Fault.RATE_LIMITED,
    Fault.SERVER_ERROR,
    Fault.RECIPIENT_REFUSED,
    Fault.CONTENT_REFUSED,
]


@pytest.mark.parametrize("fault", ONE_ANSWER)
def test_after_an_answer_that_took_nothing_the_next_send_delivers_once(rig, fault):
    if fault in rig.cannot:
        pytest.skip(f"{rig.name} cannot produce {fault}: {rig.cannot[fault]}")
    msg = digest_message()
    rig.script(msg.key, fault)
    mailer = rig.mailer()

    first = mailer.send(msg, idempotency_key=str(msg.key))
    again = mailer.send(msg, idempotency_key=str(msg.key))

    assert (first.accepted, again.accepted) == (False, True)
    assert rig.held(msg.key) == 1
