"""The project's signature check against Svix's own library, both ways, and the header families.

Resend's webhooks are signed by Svix, so the check must accept exactly what `svix` signs, and the
loopback provider's signer (the rig the other tests use) must produce what `svix` accepts.
"""

import base64
from datetime import UTC, datetime, timedelta

import pytest
from svix.webhooks import Webhook, WebhookVerificationError

from digest_pipeline.domain.webhooks import (
    DEFAULT_TOLERANCE,
    STANDARD_HEADERS,
    SVIX_HEADERS,
    Verdict,
    parse_secret,
    signed_request,
    verify,
)
from digest_pipeline.rigs.servers.resend_events import signed_headers
from digest_pipeline_tests.svix_signing import svix_headers

NOW = datetime(2026, 10, 19, 6, 0, tzinfo=UTC)
SECRET = "whsec_" + base64.b64encode(b"s" * 32).decode()
OTHER_SECRET = "whsec_" + base64.b64encode(b"o" * 32).decode()
BODY = b'{"type":"email.delivered","data":{"email_id":"em_1"}}'


def svix_signed(
    names: tuple[str, str, str],
    *,
    secret: str = SECRET,
    event_id: str = "msg_2mXa",
    at: datetime = NOW,
    body: bytes = BODY,
) -> dict[str, str]:
    """Headers named `names` carrying a signature made by Svix's library."""
    return svix_headers(names, event_id, body, at, secret)


def check(headers: dict[str, str], body: bytes = BODY, now: datetime = NOW) -> Verdict:
    return verify(signed_request(headers, body), (parse_secret(SECRET),), now, DEFAULT_TOLERANCE)


@pytest.mark.parametrize("names", [SVIX_HEADERS, STANDARD_HEADERS], ids=["svix", "webhook"])
def test_what_svix_signs_is_accepted_under_either_header_family(names):
    assert check(svix_signed(names)) is Verdict.ACCEPTED


@pytest.mark.parametrize("names", [SVIX_HEADERS, STANDARD_HEADERS], ids=["svix", "webhook"])
def test_what_svix_signs_with_another_secret_or_over_another_body_is_forged(names):
    assert check(svix_signed(names, secret=OTHER_SECRET)) is Verdict.FORGED
    assert check(svix_signed(names, body=b"{}")) is Verdict.FORGED


@pytest.mark.parametrize("names", [SVIX_HEADERS, STANDARD_HEADERS], ids=["svix", "webhook"])
def test_what_svix_signed_too_long_ago_or_ahead_is_expired(names):
    late = NOW + DEFAULT_TOLERANCE + timedelta(seconds=1)
    assert check(svix_signed(names), now=late) is Verdict.EXPIRED
    assert check(svix_signed(names, at=late)) is Verdict.EXPIRED


def test_svix_accepts_what_the_provider_rigs_signer_produces():
    # svix checks the timestamp against the real clock, so the rig signs at the real time
    stamp = int(datetime.now(UTC).timestamp())
    headers = signed_headers(SECRET, "msg_rig1", stamp, BODY)
    Webhook(SECRET).verify(BODY, headers)  # raises if the rig's signature is not Svix's
    svix_names = dict(zip(STANDARD_HEADERS, SVIX_HEADERS, strict=True))
    Webhook(SECRET).verify(BODY, {svix_names.get(k, k): v for k, v in headers.items()})


def test_svix_refuses_the_rigs_signature_under_another_secret_or_body():
    stamp = int(datetime.now(UTC).timestamp())
    headers = signed_headers(SECRET, "msg_rig2", stamp, BODY)
    with pytest.raises(WebhookVerificationError):
        Webhook(OTHER_SECRET).verify(BODY, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(BODY + b" ", headers)


def test_a_request_with_both_families_is_read_from_svix_alone():
    good_svix = svix_signed(SVIX_HEADERS)
    good_standard = svix_signed(STANDARD_HEADERS)
    forged_svix = svix_signed(SVIX_HEADERS, secret=OTHER_SECRET)
    forged_standard = svix_signed(STANDARD_HEADERS, secret=OTHER_SECRET)
    assert check({**good_svix, **forged_standard}) is Verdict.ACCEPTED
    assert check({**forged_svix, **good_standard}) is Verdict.FORGED


@pytest.mark.parametrize("dropped", SVIX_HEADERS)
def test_a_svix_trio_with_a_gap_is_missing_and_never_filled_from_webhook_headers(dropped):
    headers = {**svix_signed(STANDARD_HEADERS), **svix_signed(SVIX_HEADERS)}
    del headers[dropped]
    assert check(headers) is Verdict.MISSING


def test_the_event_id_is_the_one_of_the_family_read():
    headers = {
        **svix_signed(SVIX_HEADERS, event_id="msg_svix"),
        **svix_signed(STANDARD_HEADERS, event_id="msg_standard"),
    }
    assert signed_request(headers, BODY).event_id == "msg_svix"
    assert signed_request(svix_signed(STANDARD_HEADERS), BODY).event_id == "msg_2mXa"
