"""The SMTP mailer against Postfix's `smtp-sink`: a peer nobody here wrote, faulted by its options.

The aiosmtpd peer (smtp_peer.py) is scripted by us and could share our reading of RFC 5321;
smtp-sink answers as Postfix's author wrote it. Each fault its manual offers must come back as
the class the table atop adapters/mail/smtp.py names, and whatever reached the peer without a
reply to the final dot must be `unknown`, never a class that says the message was not sent. A
message it accepts must arrive once and parse back to the message.
"""

import contextlib
import email
import email.policy
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path

import pytest

from digest_pipeline.adapters.mail.smtp import SmtpMailer
from digest_pipeline.domain.bounces import hard_bounce
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.feedback import SuppressionReason
from digest_pipeline.domain.model import Message
from digest_pipeline.rigs.servers.smtp_sink import SinkFaults, SinkMessage, SmtpSink, find_smtp_sink
from digest_pipeline_tests.conftest import T0, require_tool
from digest_pipeline_tests.integration.test_smtp_mailer import message
from digest_pipeline_tests.smtp_peer import loopback_settings

pytestmark = pytest.mark.integration

T, THR, P, U = (
    FailureClass.TRANSIENT,
    FailureClass.THROTTLED,
    FailureClass.PERMANENT,
    FailureClass.UNKNOWN,
)
#: the mailer's one timeout (seconds); every delay below is longer
TIMEOUT = 1.0
#: smtp-sink's `-W` delay (whole seconds), past TIMEOUT
SLOW = 3
#: how long a dump may take to show after the mailer returned
DUMP_WAIT_SECONDS = 3.0


@dataclass(frozen=True)
class Fault:
    faults: SinkFaults
    expected: tuple[FailureClass, str]
    #: the message's bytes and final dot reached smtp-sink (it dumped them)
    left: bool = False
    #: a permanent refusal of the mailbox itself: the customer is suppressed (domain/bounces.py)
    bounce: bool = False


def _soft(command: str, reply: str | None = None) -> SinkFaults:
    return SinkFaults(soft_reject=(command,), soft_reply=reply)


def _hard(command: str, reply: str | None = None) -> SinkFaults:
    return SinkFaults(hard_reject=(command,), hard_reply=reply)


# smtp-sink's default replies: soft "450 4.3.0 Error: command failed", hard "500 5.3.0 Error:
# command failed", `-Q` "421 4.0.0 Server closing connection" (man smtp-sink: -b, -B, -Q).
FAULTS = {
    # 4yz (RFC 5321 §4.2.1): transient, but 452/454 are throttling
    "450-at-rcpt": Fault(_soft("RCPT"), (T, "smtp:450:4.3.0")),
    "452-at-rcpt": Fault(
        _soft("RCPT", "452 4.5.3 Error: too many recipients"), (THR, "smtp:452:4.5.3")
    ),
    "454-at-rcpt": Fault(_soft("RCPT", "454 4.7.0 Error: rate limited"), (THR, "smtp:454:4.7.0")),
    "450-at-data": Fault(_soft("DATA"), (T, "smtp:450:4.3.0")),
    "452-at-data": Fault(
        _soft("DATA", "452 4.3.1 Error: insufficient storage"), (THR, "smtp:452:4.3.1")
    ),
    # a reply to the dot is the relay's answer, even though smtp-sink dumped the transcript
    "451-at-dot": Fault(_soft(".", "451 4.3.0 Error: try again"), (T, "smtp:451:4.3.0"), left=True),
    "454-at-dot": Fault(
        _soft(".", "454 4.7.0 Error: rate limited"), (THR, "smtp:454:4.7.0"), left=True
    ),
    # 5yz: permanent; only a refusal of the mailbox (RFC 3463 X.1.1) is a hard bounce
    "500-at-rcpt": Fault(_hard("RCPT"), (P, "smtp:500:5.3.0")),
    "550-5.1.1-at-rcpt": Fault(
        _hard("RCPT", "550 5.1.1 <c1@example.test>: Recipient address rejected: User unknown"),
        (P, "smtp:550:5.1.1"),
        bounce=True,
    ),
    "550-bare-at-rcpt": Fault(_hard("RCPT", "550 Error: policy"), (P, "smtp:550")),
    "554-5.7.1-at-data": Fault(_hard("DATA", "554 5.7.1 Error: rejected"), (P, "smtp:554:5.7.1")),
    "552-at-dot": Fault(_hard(".", "552 5.3.4 Error: too big"), (P, "smtp:552:5.3.4"), left=True),
    # a hang-up (no reply) before the dot: the message never left
    "hang-up-after-mail": Fault(SinkFaults(hang_up=("MAIL",)), (T, "smtp:dropped")),
    "hang-up-after-rcpt": Fault(SinkFaults(hang_up=("RCPT",)), (T, "smtp:dropped")),
    "hang-up-after-data": Fault(SinkFaults(hang_up=("DATA",)), (T, "smtp:dropped")),
    # ... and after it: the relay may have taken the message
    "hang-up-after-dot": Fault(
        SinkFaults(hang_up=(".",)), (U, "smtp:dropped_after_data"), left=True
    ),
    # 421 closing (§4.2.2): transient wherever it comes, a definite "not taken" after the dot too
    "421-after-rcpt": Fault(SinkFaults(closing=("RCPT",)), (T, "smtp:421:4.0.0")),
    "421-after-dot": Fault(SinkFaults(closing=(".",)), (T, "smtp:421:4.0.0"), left=True),
    # a reply slower than the mailer's timeout
    "slow-rcpt": Fault(SinkFaults(delays=(("RCPT", SLOW),)), (T, "smtp:timeout")),
    "slow-354": Fault(SinkFaults(delays=(("DATA", SLOW),)), (T, "smtp:timeout")),
    "slow-dot": Fault(SinkFaults(delays=((".", SLOW),)), (U, "smtp:timeout_after_data"), left=True),
    # the greeting itself refused
    "450-greeting": Fault(_soft("CONNECT"), (T, "smtp:450:4.3.0")),
    "500-greeting": Fault(_hard("CONNECT"), (P, "smtp:500:5.3.0")),
}
#: the classes that tell the deliverer the relay did not take the message
NOT_SENT = {T, THR, P}


@pytest.fixture(scope="module")
def smtp_sink_binary() -> Path:
    return require_tool(find_smtp_sink(), "smtp-sink", "postfix")


@pytest.fixture
def sink_for(smtp_sink_binary: Path) -> Iterator[Callable[[SinkFaults], SmtpSink]]:
    """Starts smtp-sink with the given faults; everything started stops after the test."""
    with contextlib.ExitStack() as stack:
        yield lambda faults: stack.enter_context(SmtpSink(faults, binary=smtp_sink_binary))


def send(sink: SmtpSink, msg: Message, timeout: float = TIMEOUT) -> SendOutcome:
    mailer = SmtpMailer(loopback_settings(sink.port, timeout_seconds=timeout))
    try:
        return mailer.send(msg, idempotency_key=str(msg.key))
    finally:
        mailer.close()


def dumps(sink: SmtpSink, expected: int) -> list[SinkMessage]:
    """The sink's dumps, once `expected` have shown (or the wait is over)."""
    deadline = time.monotonic() + DUMP_WAIT_SECONDS
    found = sink.messages()
    while len(found) < expected and time.monotonic() < deadline:
        time.sleep(0.05)
        found = sink.messages()
    return found


def parsed(raw: bytes) -> EmailMessage:
    result = email.message_from_bytes(raw, policy=email.policy.default)
    assert isinstance(result, EmailMessage)
    return result


def _lines(text: str | None) -> list[str]:
    return (text or "").replace("\r\n", "\n").rstrip("\n").split("\n")


@pytest.mark.parametrize("name", list(FAULTS))
def test_each_fault_of_the_real_peer_maps_as_the_mailers_table_says(sink_for, name):
    fault = FAULTS[name]
    sink = sink_for(fault.faults)

    outcome = send(sink, message())

    assert not outcome.accepted
    assert (outcome.failure_class, outcome.detail) == fault.expected
    # what reached the peer without a reply is never reported as not sent
    left = dumps(sink, 1 if fault.left else 0)
    assert len(left) == (1 if fault.left else 0)
    if left and outcome.failure_class in NOT_SENT:
        assert outcome.detail.split(":")[1].isdigit(), "a refusal needs the relay's reply code"
    suppression = hard_bounce("customer-1", outcome, T0)
    assert (suppression is not None) is fault.bounce
    if suppression is not None:
        assert (suppression.reason, suppression.source) == (
            SuppressionReason.HARD_BOUNCE,
            "mailer:smtp:550:5.1.1",
        )


@pytest.mark.parametrize(
    ("faults", "timeout"),
    [
        (SinkFaults(), TIMEOUT),
        # a final reply slower than a second, inside the mailer's timeout
        (SinkFaults(delays=((".", 1),)), 1.0 + SLOW),
        # EHLO without 8BITMIME: the message goes 7-bit and must still decode the same
        (SinkFaults(eight_bit=False), TIMEOUT),
    ],
    ids=["plain", "slow-but-in-time", "no-8bitmime"],
)
def test_a_message_the_peer_accepts_arrives_once_and_parses_back(sink_for, faults, timeout):
    msg = message()  # its text part holds an em dash: 8-bit unless the relay lacks 8BITMIME
    sink = sink_for(faults)

    outcome = send(sink, msg, timeout)

    assert (outcome.accepted, outcome.failure_class) == (True, None)
    (got,) = dumps(sink, 1)
    time.sleep(0.2)  # a second copy would show by now
    assert len(sink.messages()) == 1
    assert got.rcpt_args == ("<c1@example.test>",)
    assert got.mail_args.startswith("<digest@example.com>")
    assert ("BODY=8BITMIME" in got.mail_args) is faults.eight_bit
    assert got.raw.isascii() or faults.eight_bit
    back = parsed(got.raw)
    assert back.defects == []
    assert back["X-Digest-Operation-Key"] == str(msg.key)
    assert back["Message-ID"] == outcome.provider_message_id
    assert (back["From"], back["To"], back["Subject"]) == (msg.sender, msg.recipient, msg.subject)
    plain, html = back.iter_parts()
    assert _lines(plain.get_content()) == _lines(msg.text)
    assert _lines(html.get_content()) == _lines(msg.html)
