"""RFC 5322 §2.1.1: no header line over 998 characters leaves, whatever the snapshot holds.

A snapshot frozen before the 320-character address cap may still hold a 100 KB address; it must
become a permanent `invalid_recipient` before any mailer opens a file or a connection.
"""

import pytest

from digest_pipeline.adapters.mail.mime import check_message, to_bytes
from digest_pipeline.adapters.mail.outbox import OutboxMailer
from digest_pipeline.domain.errors import RenderError
from digest_pipeline.domain.failures import FailureClass
from digest_pipeline_tests.adapters.test_mime import KEY, message

HUGE_ADDRESS = "x" * 100_000 + "@example.com"
MAX_LINE = 998


def at_length(name: str, total: int) -> str:
    """A space-less value that makes `name: value` exactly `total` characters."""
    return "v" * (total - len(name) - 2)


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(message(recipient=HUGE_ADDRESS), id="To 100 KB"),
        pytest.param(message(recipient=at_length("To", 999)[:-12] + "@example.com"), id="To 999"),
        pytest.param(message(subject=at_length("Subject", MAX_LINE + 1)), id="Subject 999"),
        pytest.param(message(headers=(("X-Note", at_length("X-Note", 999)),)), id="X-Note 999"),
    ],
)
def test_a_header_line_over_998_characters_is_refused_without_its_value(bad):
    for refuse in (check_message, to_bytes):
        with pytest.raises(RenderError, match="longer than 998 characters") as raised:
            refuse(bad)
        assert "xxxx" not in str(raised.value)
        assert "vvvv" not in str(raised.value)


def test_a_header_line_of_exactly_998_characters_is_sent_as_it_is():
    value = at_length("X-Note", MAX_LINE)
    data = to_bytes(message(headers=(("X-Note", value),)))
    assert f"\r\nX-Note: {value}\r\n".encode() in data
    assert max(len(line) for line in data.split(b"\r\n")) <= MAX_LINE


def test_the_outbox_records_a_permanent_invalid_recipient_and_stores_nothing(tmp_path):
    outbox = OutboxMailer(tmp_path)
    outcome = outbox.send(message(recipient=HUGE_ADDRESS), idempotency_key=str(KEY))
    assert outcome.failure_class is FailureClass.PERMANENT
    assert outcome.detail == "invalid_recipient"
    assert list(outbox.stored()) == []
