"""An address a digest cannot be addressed to is `invalid_recipient`, never `render_error`.

The runbook reads `render_error` as "a product broke the digests"; one customer's bad address
must not look like that. Each mailer refuses before anything leaves, so every outcome here is
permanent, where a send that got as far as the network would be accepted or transient.
"""

import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import httpx
import pytest

from digest_pipeline.adapters.mail.http import HttpProviderMailer
from digest_pipeline.adapters.mail.mime import check_message, to_bytes
from digest_pipeline.adapters.mail.outbox import OutboxMailer
from digest_pipeline.adapters.mail.smtp import SmtpMailer
from digest_pipeline.domain.errors import InvalidRecipient, RenderError
from digest_pipeline.domain.failures import (
    INVALID_RECIPIENT,
    RENDER_ERROR,
    FailureClass,
    SendOutcome,
    render_failure_code,
)
from digest_pipeline.domain.model import Message, message_id_for
from digest_pipeline.ports import Mailer
from digest_pipeline.settings import ProviderSettings, SmtpSettings
from digest_pipeline_tests.adapters.test_mime import KEY
from digest_pipeline_tests.adapters.test_mime import message as base_message

#: recipients the header rules every mailer applies refuse (`check_message`), by test id
RULE_BREAKING = {
    "line-break": "a@example.test\r\nBcc: x@evil.test",
    "over-998": "x" * 1000 + "@example.test",
    "lone-surrogate": "shopper\ud800@example.test",
}
#: recipients CPython 3.11's header parser crashes on as a To value (IndexError,
#: AttributeError): refused by the mailers that serialise (the HTTP one leaves it to the provider)
UNPARSEABLE = {"parser-index-error": "^@", "parser-attribute-error": "x@["}
#: messages refused for what many digests share: a product's text, the configured sender
PRODUCT_BROKEN: dict[str, dict[str, object]] = {
    "product-title-line-break": {"subject": "Lamp\r\nBcc: x@evil.test"},
    "product-text-lone-surrogate": {"text": "Lamp \ud800"},
}
SENDER_UNPARSEABLE: dict[str, dict[str, object]] = {"sender-parser-crash": {"sender": "x@["}}
P = FailureClass.PERMANENT


def message(**overrides: object) -> Message:
    headers = (("Message-ID", message_id_for(KEY)), ("X-Digest-Operation-Key", str(KEY)))
    return base_message(**({"headers": headers} | overrides))


def outbox(tmp_path) -> OutboxMailer:
    return OutboxMailer(tmp_path / "outbox")


def provider(_tmp_path) -> HttpProviderMailer:
    # it accepts whatever reaches it: an outcome other than `sent` was decided before a request
    accept = httpx.MockTransport(lambda _: httpx.Response(200, json={"id": "provider-1"}))
    settings = ProviderSettings("https://api.provider.test", "re_key", 1.0, timedelta(hours=24))
    return HttpProviderMailer(settings, transport=accept)


def relay(_tmp_path) -> SmtpMailer:
    # nobody listens on the port: a send that got as far as connecting is `smtp:connect_refused`
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return SmtpMailer(SmtpSettings("127.0.0.1", port, None, None, "none", 1.0))


MAILERS = [outbox, provider, relay]
SERIALISING = [outbox, relay]


def cases(mailers: list[Callable[..., Mailer]], values: dict[str, Any]) -> list[Any]:
    """Each mailer with each value, named `mailer-value`."""
    return [pytest.param(m, v, id=f"{m.__name__}-{i}") for m in mailers for i, v in values.items()]


def send(mailer: Mailer, msg: Message) -> SendOutcome:
    try:
        return mailer.send(msg, idempotency_key=str(msg.key))
    finally:
        mailer.close()


def test_the_code_names_an_invalid_recipient_and_every_other_refusal_a_render_error():
    assert render_failure_code(InvalidRecipient("k: recipient is not a single address")) == (
        INVALID_RECIPIENT
    )
    assert render_failure_code(RenderError("k: no digest rows")) == RENDER_ERROR
    assert issubclass(InvalidRecipient, RenderError)  # every `except RenderError` still holds


@pytest.mark.parametrize("recipient", [*RULE_BREAKING.values(), *UNPARSEABLE.values()])
def test_serialising_refuses_a_bad_address_as_an_invalid_recipient(recipient):
    with pytest.raises(InvalidRecipient) as raised:
        to_bytes(message(recipient=recipient))
    assert "example.test" not in str(raised.value)


@pytest.mark.parametrize("overrides", [*PRODUCT_BROKEN.values(), *SENDER_UNPARSEABLE.values()])
def test_serialising_refuses_anything_else_as_a_plain_render_error(overrides):
    with pytest.raises(RenderError) as raised:
        to_bytes(message(**overrides))
    assert not isinstance(raised.value, InvalidRecipient)


def test_the_header_rules_name_the_to_header_an_invalid_recipient():
    with pytest.raises(InvalidRecipient, match="header To holds a line break"):
        check_message(message(recipient="a@example.test\nBcc: x@evil.test"))
    with pytest.raises(RenderError, match="header Subject holds a line break") as subject:
        check_message(message(subject="a\nBcc: x@evil.test"))
    assert not isinstance(subject.value, InvalidRecipient)


@pytest.mark.parametrize(
    ("make", "recipient"), cases(MAILERS, RULE_BREAKING) + cases(SERIALISING, UNPARSEABLE)
)
def test_each_mailer_records_a_bad_address_as_invalid_recipient(tmp_path, make, recipient):
    outcome = send(make(tmp_path), message(recipient=recipient))

    assert (outcome.failure_class, outcome.detail) == (P, INVALID_RECIPIENT)
    assert not (tmp_path / "outbox").exists()


@pytest.mark.parametrize(
    ("make", "overrides"), cases(MAILERS, PRODUCT_BROKEN) + cases(SERIALISING, SENDER_UNPARSEABLE)
)
def test_each_mailer_still_records_a_broken_message_as_render_error(tmp_path, make, overrides):
    outcome = send(make(tmp_path), message(**overrides))

    assert (outcome.failure_class, outcome.detail) == (P, RENDER_ERROR)
    assert not (tmp_path / "outbox").exists()


def test_smtp_refuses_a_recipient_its_envelope_cannot_carry_as_invalid_recipient(tmp_path):
    # one plain addr-spec (the composer takes it), but not ASCII: RCPT TO needs SMTPUTF8
    outcome = send(relay(tmp_path), message(recipient="jürgen@example.test"))

    assert (outcome.failure_class, outcome.detail) == (P, INVALID_RECIPIENT)


def test_smtp_refuses_a_sender_its_envelope_cannot_carry_as_a_configuration_fault(tmp_path):
    # the sender is the same in every message: a breaker-worthy code of its own
    both = message(sender="dïgest@example.com", recipient="jürgen@example.test")
    for msg in (message(sender="dïgest@example.com"), both):
        outcome = send(relay(tmp_path), msg)
        assert (outcome.failure_class, outcome.detail) == (P, "smtp:bad_envelope_sender")


@pytest.mark.parametrize("make", MAILERS)
def test_a_good_message_gets_past_every_check(tmp_path, make):
    # the counterpart of the tests above: only the refusals are permanent
    outcome = send(make(tmp_path), message())

    assert outcome.accepted or (outcome.failure_class, outcome.detail) == (
        FailureClass.TRANSIENT,
        "smtp:connect_refused",
    )
