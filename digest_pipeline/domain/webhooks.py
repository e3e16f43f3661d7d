"""Provider webhook signatures as Svix (and so Resend) sign them: HMAC-SHA256 with a timestamp.

The signed text is `{id}.{timestamp}.{raw body}`; the signature header holds space-separated
`v1,<base64>` entries (several during a key rotation). The three values come from one header
family, `svix-*` or `webhook-*` (`signed_request`). A request is accepted only when one entry
matches one configured key (constant-time) and its timestamp lies within the replay window of
`now`; `now` is handed in, never read here.
"""

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

#: Svix's prefix of a signing secret; the rest is the key, base64-encoded
SECRET_PREFIX = "whsec_"
#: a shorter key is guessable offline from one signed request
MIN_KEY_BYTES = 16
#: Svix's default tolerance: a signed request older (or newer) than this is refused
DEFAULT_TOLERANCE = timedelta(minutes=5)
#: what a provider's name may be: it is a URL segment and a column value
PROVIDER_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
#: what an event id (`svix-id`, `webhook-id`) may be (Svix's `msg_…`): stored as the event id, so bounded and printable
EVENT_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_TIMESTAMP = re.compile(r"[0-9]{1,12}")


class InvalidWebhookSecret(ValueError):
    """A configured signing secret cannot be used; the message never repeats the secret."""


def parse_secret(raw: str) -> bytes:
    """The HMAC key of a signing secret: `whsec_<base64>` decoded, any other text as UTF-8.

    Raises:
        InvalidWebhookSecret: the base64 is malformed or the key is shorter than 16 bytes.
    """
    text = raw.strip()
    if text.startswith(SECRET_PREFIX):
        try:
            key = base64.b64decode(text[len(SECRET_PREFIX) :], validate=True)
        except (binascii.Error, ValueError) as e:
            raise InvalidWebhookSecret("a whsec_ secret must be whsec_ and base64") from e
    else:
        key = text.encode()
    if len(key) < MIN_KEY_BYTES:
        raise InvalidWebhookSecret(f"the key is shorter than {MIN_KEY_BYTES} bytes")
    return key


def signature(key: bytes, event_id: str, timestamp: int, body: bytes) -> str:
    """One `v1,<base64>` entry of the signature header (`svix-signature`, `webhook-signature`)."""
    signed = f"{event_id}.{timestamp}.".encode() + body
    mac = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


class Verdict(StrEnum):
    """What the signature check found; only ACCEPTED lets a request through."""

    #: one signature matches one key and the timestamp is inside the window
    ACCEPTED = "accepted"
    #: a header is missing, or the id or timestamp is malformed
    MISSING = "missing"
    #: the timestamp is outside the replay window
    EXPIRED = "expired"
    #: no signature matches any key
    FORGED = "forged"


@dataclass(frozen=True)
class SignedRequest:
    """The three signed values of a request (None where absent) and its raw body."""

    event_id: str | None
    timestamp: str | None
    signatures: str | None
    body: bytes


#: the headers Svix sends to Resend's ordinary accounts (id, timestamp, signatures)
SVIX_HEADERS = ("svix-id", "svix-timestamp", "svix-signature")
#: the Standard Webhooks names Svix sends to white-label accounts; same values, same signing
STANDARD_HEADERS = ("webhook-id", "webhook-timestamp", "webhook-signature")


def signed_request(headers: Mapping[str, str], body: bytes) -> SignedRequest:
    """The request's id, timestamp and signatures, read from one header family, and its body.

    `headers` is looked up by lower-case name (Starlette's `Headers` matches any case). Any
    `svix-*` header selects the `svix-*` trio, else `webhook-*` is read; the families are never
    mixed, so a trio with a gap is MISSING rather than filled from the other family. A request
    carrying both families is read from `svix-*` alone, the family Svix's own library prefers.
    """
    names = SVIX_HEADERS if any(name in headers for name in SVIX_HEADERS) else STANDARD_HEADERS
    event_id, timestamp, signatures = (headers.get(name) for name in names)
    return SignedRequest(event_id, timestamp, signatures, body)


def verify(
    request: SignedRequest, keys: Sequence[bytes], now: datetime, tolerance: timedelta
) -> Verdict:
    """Checks the request's signature against every key and its timestamp against `now`.

    Every entry is compared with every key, whatever matched first, so the time taken does not
    tell which entry or key was close.
    """
    if (
        request.event_id is None
        or request.timestamp is None
        or request.signatures is None
        or not EVENT_ID.fullmatch(request.event_id)
        or not _TIMESTAMP.fullmatch(request.timestamp)
    ):
        return Verdict.MISSING
    stamp = int(request.timestamp)
    # compared as seconds: a far-off stamp must be refused, not overflow a datetime
    if abs(now.timestamp() - stamp) > tolerance.total_seconds():
        return Verdict.EXPIRED
    given = [
        entry.encode("utf-8", "replace")
        for entry in request.signatures.split()
        if entry.startswith("v1,")
    ]
    matched = False
    for key in keys:
        expected = signature(key, request.event_id, stamp, request.body).encode()
        for entry in given:
            matched |= hmac.compare_digest(expected, entry)
    return Verdict.ACCEPTED if matched else Verdict.FORGED
