"""`to_bytes(seven_bit=True)`: what a relay without 8BITMIME (RFC 6152) may be handed.

Every byte is ASCII, the parts decode back to the same text, and an ASCII message is the same
bytes either way, so only messages that need it change form.
"""

from email import message_from_bytes
from email.policy import SMTP

import pytest

from digest_pipeline.adapters.mail.mime import to_bytes
from digest_pipeline.domain.model import Message
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline_tests.conftest import W42

KEY = OperationKey(W42, "customer-0001")


def message(text: str, html: str | None) -> Message:
    return Message(
        key=KEY,
        recipient="a@example.test",
        sender="Café <digest@example.com>",
        subject="Vos sélections — semaine 42",
        text=text,
        html=html,
        headers=(("X-Digest-Operation-Key", str(KEY)),),
    )


NON_ASCII = [
    # text, html: one row per shape of part
    ("Lampe — 19,90 €\nhttps://shop.example/p/1\n", "<p>Lampe &mdash; 19,90 €</p>"),
    ("Ünïcödé " * 200 + "\n", None),  # one line past 998 octets once encoded
    ("日本語のテキスト\n" * 20, "<p>日本語</p>"),  # mostly non-ASCII: base64 is shorter
]


@pytest.mark.parametrize(("text", "html"), NON_ASCII)
def test_seven_bit_bytes_are_ascii_and_decode_to_the_same_parts(text, html):
    msg = message(text, html)

    raw = to_bytes(msg, seven_bit=True)

    assert raw.isascii()
    parsed = message_from_bytes(raw, policy=SMTP)
    parts = [parsed] if html is None else list(parsed.iter_parts())
    contents = [p.get_content().replace("\r\n", "\n") for p in parts]
    assert contents[0] == text
    if html is not None:
        assert contents[1].rstrip("\n") == html
    assert all(len(line) <= 998 for line in raw.split(b"\r\n"))


def test_the_default_still_sends_short_non_ascii_lines_as_8bit():
    # the outbox and the HTTP provider keep the form they had, as do 8BITMIME relays
    assert b"Content-Transfer-Encoding: 8bit" in to_bytes(message(*NON_ASCII[0]))


def test_an_ascii_message_is_the_same_bytes_either_way():
    msg = message("Hello!\nhttps://shop.example/p/1\n", "<p>Hello!</p>")

    assert to_bytes(msg, seven_bit=True) == to_bytes(msg)
