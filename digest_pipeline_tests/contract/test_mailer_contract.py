"""The mailer contract, run unchanged over the fake and every real mailer.

Each real mailer runs against a real peer on loopback (a Maildir, the Resend-style, Postmark and
SendGrid HTTP servers, an SMTP relay), started by its rig (mailer_rigs.py), and the peer's own
store, not the mailer, says how many messages were delivered. The rigs' faults are in
test_mailer_faults_contract.py, their lost answers and reconciliation in
test_mailer_reconcile_contract.py.
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from digest_pipeline.domain.failures import FailureClass
from digest_pipeline.domain.model import LookupStatus, Message, message_id_for
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.ports import Mailer
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.contract.all_mailer_rigs import PEER_RIGS, RIGS

MAILERS = list(RIGS)


@dataclass
class UnderTest:
    mailer: Mailer
    #: how many messages the peer holds for an operation key
    delivered: Callable[[str], int]


@pytest.fixture(params=MAILERS)
def under_test(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[UnderTest]:
    with RIGS[request.param](tmp_path) as rig:
        yield UnderTest(rig.mailer(), lambda key: rig.held(OperationKey.parse(key)))


def message(n: int = 1, subject: str = "Your picks", customer: str = "customer") -> Message:
    key = OperationKey(W42, f"{customer}-{n:04d}")
    return Message(
        key=key,
        recipient=f"shopper.{n:04d}@example.test",
        sender="digest@example.com",
        subject=subject,
        text="Your picks\n",
        html="<p>Your picks</p>",
        headers=(("Message-ID", message_id_for(key)), ("X-Digest-Operation-Key", str(key))),
    )


def send(mailer: Mailer, msg: Message):
    return mailer.send(msg, idempotency_key=str(msg.key))


def test_an_accepted_send_is_delivered_once_with_a_provider_id(under_test):
    msg = message()
    outcome = send(under_test.mailer, msg)
    assert outcome.accepted
    assert outcome.provider_message_id
    assert under_test.delivered(str(msg.key)) == 1


def test_the_same_key_twice_is_never_delivered_twice_where_idempotency_is_claimed(under_test):
    msg = message()
    first, again = send(under_test.mailer, msg), send(under_test.mailer, msg)
    assert first.accepted
    assert again.accepted
    if under_test.mailer.capabilities.idempotency_window is not None:
        assert under_test.delivered(str(msg.key)) == 1
        assert again.provider_message_id == first.provider_message_id
    else:
        # SMTP: no key, so the second send is a second message; this is why its unknowns
        # go to an operator rather than to an automatic resend.
        assert under_test.delivered(str(msg.key)) == 2


def test_lookup_matches_the_declared_capability(under_test):
    msg = message()
    mailer = under_test.mailer
    before = mailer.lookup(str(msg.key))
    send(mailer, msg)
    after = mailer.lookup(str(msg.key))
    if mailer.capabilities.can_lookup:
        assert (before.status, after.status) == (LookupStatus.NOT_FOUND, LookupStatus.FOUND)
    else:
        assert before.status is after.status is LookupStatus.UNSUPPORTED


def test_distinct_keys_are_distinct_messages(under_test):
    for n in range(1, 4):
        assert send(under_test.mailer, message(n)).accepted
    assert [under_test.delivered(str(message(n).key)) for n in range(1, 4)] == [1, 1, 1]


def test_keys_differing_only_in_letter_case_are_distinct_messages(under_test):
    lower, upper = message(2), message(2, customer="CUSTOMER")
    first, second = send(under_test.mailer, lower), send(under_test.mailer, upper)
    assert (first.accepted, second.accepted) == (True, True)
    assert not second.duplicate
    assert [under_test.delivered(str(m.key)) for m in (lower, upper)] == [1, 1]
    if under_test.mailer.capabilities.can_lookup:
        assert under_test.mailer.lookup(str(upper.key)).status is LookupStatus.FOUND


@pytest.mark.parametrize("under_test", ["outbox", *PEER_RIGS], indirect=True)
def test_a_header_injection_attempt_is_permanent_and_delivers_nothing(under_test):
    msg = message(subject="hi\r\nBcc: x@evil.example")
    outcome = send(under_test.mailer, msg)
    assert outcome.failure_class is FailureClass.PERMANENT
    assert under_test.delivered(str(msg.key)) == 0
