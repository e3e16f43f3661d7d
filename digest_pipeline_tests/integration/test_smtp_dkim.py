"""DKIM and 8BITMIME on the SMTP path, against a real aiosmtpd server on loopback.

The bytes the server stores must verify with dkimpy's own verifier against the published key, a
changed body must not, and the body is 7-bit whenever the relay does not offer 8BITMIME.
"""

import base64
import email
import email.policy
from collections.abc import Iterator

import dkim  # type: ignore[import-untyped]
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from digest_pipeline.adapters.mail.smtp import SIGNED_HEADERS, SmtpMailer
from digest_pipeline.dkim_settings import DkimSettings
from digest_pipeline.domain.failures import FailureClass
from digest_pipeline.domain.model import Message
from digest_pipeline_tests.integration.test_smtp_mailer import message
from digest_pipeline_tests.smtp_peer import (
    SmtpPeer,
    smtp_peer_fixture,  # noqa: F401  (provides the `smtp_peer` fixture)
)

SELECTOR, DOMAIN = "digest2026", "example.com"  # test_smtp_mailer's sender is digest@example.com


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def signing(rsa_key: rsa.RSAPrivateKey) -> DkimSettings:
    pem = rsa_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    return DkimSettings(SELECTOR, DOMAIN, b"rsa-sha256", pem)


@pytest.fixture(scope="module")
def dns(rsa_key: rsa.RSAPrivateKey):
    """The TXT record a receiver finds at `selector._domainkey.domain`, and nothing else."""
    der = rsa_key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    record = b"v=DKIM1; k=rsa; p=" + base64.b64encode(der)
    names = {
        f"{SELECTOR}._domainkey.{DOMAIN}.".encode(),
        f"{SELECTOR}._domainkey.{DOMAIN}".encode(),
    }

    def lookup(name: bytes, timeout: int = 5) -> bytes | None:
        return record if name in names else None

    return lookup


def _send(peer: SmtpPeer, signing: DkimSettings | None, msg: Message) -> bytes:
    mailer = SmtpMailer(peer.settings(timeout_seconds=2.0, dkim=signing))
    try:
        outcome = mailer.send(msg, idempotency_key=str(msg.key))
    finally:
        mailer.close()
    assert outcome.accepted, outcome.detail
    [received] = peer.messages
    return received.raw


@pytest.fixture
def seven_bit_peer() -> Iterator[SmtpPeer]:
    with SmtpPeer(eight_bit=False) as peer:
        yield peer


def test_the_bytes_received_verify_against_the_published_key(smtp_peer, signing, dns):
    raw = _send(smtp_peer, signing, message())

    assert raw.startswith(b"DKIM-Signature: ")
    assert dkim.verify(raw, dnsfunc=dns)
    sig = email.message_from_bytes(raw, policy=email.policy.SMTP)["DKIM-Signature"]
    fields = dict(
        part.strip().split("=", 1) for part in "".join(str(sig).split()).split(";") if part
    )
    assert (fields["d"], fields["s"], fields["c"], fields["a"]) == (
        DOMAIN,
        SELECTOR,
        "relaxed/relaxed",
        "rsa-sha256",
    )
    assert [h.lower() for h in fields["h"].split(":")] == [h.lower() for h in SIGNED_HEADERS]


def test_a_changed_body_or_header_fails_verification(smtp_peer, signing, dns):
    raw = _send(smtp_peer, signing, message())

    assert b"19.90" in raw
    assert not dkim.verify(raw.replace(b"19.90", b"99.90"), dnsfunc=dns)
    subject = b"Subject: Your weekly picks"
    assert not dkim.verify(raw.replace(subject, subject + b"!"), dnsfunc=dns)


def test_without_a_key_nothing_is_signed(smtp_peer):
    raw = _send(smtp_peer, None, message())

    assert b"DKIM-Signature" not in raw


def test_an_8bitmime_relay_is_told_body_8bitmime(smtp_peer, signing, dns):
    raw = _send(smtp_peer, signing, message())  # its text holds an em dash

    assert smtp_peer.messages[0].mail_options == ("BODY=8BITMIME",)
    assert not raw.isascii()
    assert dkim.verify(raw, dnsfunc=dns)


def test_a_relay_without_8bitmime_gets_7bit_parts_that_still_verify(seven_bit_peer, signing, dns):
    msg = message()
    raw = _send(seven_bit_peer, signing, msg)

    assert seven_bit_peer.messages[0].mail_options == ()
    assert raw.isascii()
    assert dkim.verify(raw, dnsfunc=dns)
    parsed = email.message_from_bytes(raw, policy=email.policy.SMTP)
    text, html = (part.get_content() for part in parsed.iter_parts())
    assert (text.replace("\r\n", "\n"), html.replace("\r\n", "\n").rstrip("\n")) == (
        msg.text,
        msg.html,
    )


def test_an_ascii_message_goes_without_body_parameter(smtp_peer):
    _send(smtp_peer, None, message(text="Hello!\n", html=None))

    assert smtp_peer.messages[0].mail_options == ()


def test_a_key_dkimpy_refuses_fails_the_message_before_mail_from(smtp_peer):
    broken = DkimSettings(
        SELECTOR, DOMAIN, b"rsa-sha256", b"-----BEGIN X-----\nAA==\n-----END X-----\n"
    )
    mailer = SmtpMailer(smtp_peer.settings(timeout_seconds=2.0, dkim=broken))
    try:
        outcome = mailer.send(message(), idempotency_key="k")
    finally:
        mailer.close()

    assert (outcome.accepted, outcome.failure_class, outcome.detail) == (
        False,
        FailureClass.PERMANENT,
        "smtp:dkim_error",
    )
    assert smtp_peer.messages == []
