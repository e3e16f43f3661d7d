"""Svix-style webhook signatures (`domain/webhooks.py`): key, timestamp window, rotation."""

import base64
from datetime import UTC, datetime, timedelta

import pytest

from digest_pipeline.domain.webhooks import (
    DEFAULT_TOLERANCE,
    InvalidWebhookSecret,
    SignedRequest,
    Verdict,
    parse_secret,
    signature,
    verify,
)

NOW = datetime(2026, 10, 19, 6, 0, tzinfo=UTC)
KEY = b"k" * 24
SECRET = "whsec_" + base64.b64encode(KEY).decode()
BODY = b'{"type":"email.delivered","data":{}}'


def signed(
    *,
    key: bytes = KEY,
    event_id: str = "msg_0001",
    at: datetime = NOW,
    body: bytes = BODY,
    sent_body: bytes | None = None,
) -> SignedRequest:
    stamp = int(at.timestamp())
    return SignedRequest(
        event_id, str(stamp), signature(key, event_id, stamp, body), sent_body or body
    )


def check(request: SignedRequest, keys=(KEY,), now: datetime = NOW) -> Verdict:
    return verify(request, keys, now, DEFAULT_TOLERANCE)


def test_a_whsec_secret_is_its_base64_key_and_plain_text_its_bytes():
    assert parse_secret(SECRET) == KEY
    assert parse_secret("  " + SECRET + " ") == KEY
    assert (
        parse_secret("a plain shared secret of some length")
        == b"a plain shared secret of some length"
    )


@pytest.mark.parametrize(
    "raw", ["whsec_not*base64", "whsec_" + base64.b64encode(b"short").decode(), "tiny"]
)
def test_a_secret_that_is_malformed_or_short_is_refused_without_repeating_it(raw):
    with pytest.raises(InvalidWebhookSecret) as e:
        parse_secret(raw)
    assert raw not in str(e.value)


def test_a_request_signed_with_the_key_inside_the_window_is_accepted():
    assert check(signed()) is Verdict.ACCEPTED
    assert check(signed(at=NOW - DEFAULT_TOLERANCE)) is Verdict.ACCEPTED
    assert check(signed(at=NOW + DEFAULT_TOLERANCE)) is Verdict.ACCEPTED


@pytest.mark.parametrize(
    "request_",
    [
        signed(key=b"x" * 24),  # another key
        signed(sent_body=BODY + b" "),  # the body changed after signing
        SignedRequest("msg_0002", signed().timestamp, signed().signatures, BODY),  # another id
        SignedRequest("msg_0001", str(int(NOW.timestamp()) - 1), signed().signatures, BODY),
        SignedRequest("msg_0001", signed().timestamp, "v2," + str(signed().signatures)[3:], BODY),
        SignedRequest("msg_0001", signed().timestamp, "", BODY),
    ],
    ids=["other-key", "body-changed", "other-id", "other-time", "other-version", "empty"],
)
def test_a_forged_signature_is_refused(request_):
    assert check(request_) is Verdict.FORGED


@pytest.mark.parametrize("delta", [DEFAULT_TOLERANCE + timedelta(seconds=1), timedelta(days=3650)])
def test_a_request_outside_the_replay_window_is_refused_either_way(delta):
    assert check(signed(at=NOW - delta)) is Verdict.EXPIRED
    assert check(signed(at=NOW + delta)) is Verdict.EXPIRED


@pytest.mark.parametrize(
    "request_",
    [
        SignedRequest(None, "1", "v1,x", BODY),
        SignedRequest("msg_1", None, "v1,x", BODY),
        SignedRequest("msg_1", "1", None, BODY),
        SignedRequest("msg 1", "1", "v1,x", BODY),  # an id that could not be stored as one
        SignedRequest("msg_1", "-5", "v1,x", BODY),
        SignedRequest("msg_1", "9" * 40, "v1,x", BODY),  # far beyond any datetime
    ],
)
def test_missing_or_malformed_headers_are_refused(request_):
    assert check(request_) is Verdict.MISSING


def test_during_a_rotation_either_key_and_any_listed_signature_passes():
    old, new = b"o" * 24, b"n" * 24
    by_old = signed(key=old)
    both = SignedRequest(by_old.event_id, by_old.timestamp, f"v1,bogus {by_old.signatures}", BODY)
    assert check(by_old, keys=(new, old)) is Verdict.ACCEPTED
    assert check(both, keys=(new,)) is Verdict.FORGED
    assert check(both, keys=(old,)) is Verdict.ACCEPTED
