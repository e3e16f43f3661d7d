"""SendGrid's Signed Event Webhook: ECDSA verification and the parsing of an event batch.

SendGrid signs `timestamp + raw body` (the `X-Twilio-Email-Event-Webhook-Timestamp` header's
text followed by the exact request bytes) with ECDSA over P-256 and SHA-256, and sends the
base64 DER signature in `X-Twilio-Email-Event-Webhook-Signature`. The verification key is the
base64 DER (SubjectPublicKeyInfo) public key shown in SendGrid's Mail Settings. A request is
accepted only when the signature verifies under one configured key (two during a rotation) and
its timestamp is at most `tolerance` ahead of `now` and at most `RETRY_PERIOD` behind it (below);
`now` is handed in, never read here, and the verdicts are `webhooks.Verdict`'s. The one dependency beyond the standard library is
`cryptography` (a project dependency), for the elliptic-curve arithmetic alone.

A batch is a JSON array of events. Each event is read on its own (`parse_batch`): one that
cannot be read is set aside with the reason, the others are recorded. The batch is signed, so
an event we cannot read came from SendGrid as it is and a retry would bring the same bytes;
refusing the whole batch would lose its `delivered` events with it. A body that is not an
array is refused whole (`InvalidEvent`, HTTP 400).

| SendGrid event                          | read as     | effect                                      |
|-----------------------------------------|-------------|---------------------------------------------|
| delivered                               | DELIVERED   | settles an `unknown` item, confirms a sent one |
| bounce, `type: "bounce"`                | HARD_BOUNCE | suppresses the customer (`hard_bounce`)     |
| bounce, `type: "blocked"`, other, none  | SOFT_BOUNCE | recorded only                               |
| deferred                                | SOFT_BOUNCE | recorded only: SendGrid is still retrying   |
| dropped, reason `Bounced Address`       | HARD_BOUNCE | suppresses: the address is on SendGrid's bounce list |
| dropped, reason `Spam Reporting Address`| COMPLAINT   | suppresses: the address reported spam before |
| dropped, any other reason               | OTHER       | recorded only (content, header or account causes) |
| spamreport                              | COMPLAINT   | suppresses the customer (`complaint`)       |
| unsubscribe, group_unsubscribe          | OTHER       | recorded only: `EventType` has no unsubscribe |
| processed, open, click, anything else   | OTHER       | recorded only                               |

A `bounce` without a `type` is soft: a suppression is kept for good, and SendGrid always states
the type, so only a stated permanent bounce earns one. A `dropped` event means SendGrid will
never send that message; it leaves an `unknown` item `unknown` (the event types have no
"not sent"), for an operator to resolve with that evidence.

The operation key is the event's top-level `operation_key` (SendGrid echoes a message's
`custom_args` as top-level fields); the event id is `sg_event_id`; the message id is the part of
`sg_message_id` before its first `.`, which is the `X-Message-Id` the send was answered with
(SendGrid appends its filter's suffix to it in events).
"""

import base64
import binascii
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_der_public_key

from digest_pipeline.domain.feedback import (
    MESSAGE_ID,
    EventType,
    InvalidEvent,
    ProviderEvent,
    matching,
)
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.domain.webhooks import DEFAULT_TOLERANCE, InvalidWebhookSecret, Verdict

#: the provider name its events and its `DIGEST_WEBHOOK_SECRETS` entry go by
PROVIDER = "sendgrid"

__all__ = [
    "DEFAULT_TOLERANCE",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "EventBatch",
    "SignedBatch",
    "UnreadEvent",
    "Verdict",
    "VerificationKey",
    "parse_batch",
    "parse_event",
    "parse_verification_key",
    "signed_batch",
    "verify",
]

SIGNATURE_HEADER = "x-twilio-email-event-webhook-signature"
TIMESTAMP_HEADER = "x-twilio-email-event-webhook-timestamp"
#: the public key type `verify` checks against
VerificationKey = ec.EllipticCurvePublicKey
#: how far behind `now` a signed timestamp may be: SendGrid retries a batch for up to 24 hours
#: after the event, and its documentation does not say that a retry is signed anew. A window
#: shorter than that could refuse every retry of a batch that settles an `unknown` item; a batch
#: replayed inside it records nothing twice, since each event is applied once per `sg_event_id`.
RETRY_PERIOD = timedelta(hours=25)
#: Unix seconds, as SendGrid writes them
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
#: a DER ECDSA P-256 signature is at most 72 bytes: 96 base64 characters (a little slack)
_MAX_SIGNATURE_CHARS = 128
#: `sg_event_id`: base64 or base64url text in practice; stored as the event id (128 at most)
_EVENT_ID = re.compile(r"[A-Za-z0-9._:+/=-]{1,128}")
_TYPE_NAME = re.compile(r"[a-z_]{1,64}")
KEY_FIELD = "operation_key"

#: `dropped` reasons that name the address's own standing on SendGrid's suppression lists
_DROPPED_REASONS: dict[str, EventType] = {
    "bounced address": EventType.HARD_BOUNCE,
    "spam reporting address": EventType.COMPLAINT,
}
#: event names read without looking further than the name
_TYPES: dict[str, EventType] = {
    "delivered": EventType.DELIVERED,
    "deferred": EventType.SOFT_BOUNCE,
    "spamreport": EventType.COMPLAINT,
    "unsubscribe": EventType.OTHER,
    "group_unsubscribe": EventType.OTHER,
    "group_resubscribe": EventType.OTHER,
    "processed": EventType.OTHER,
    "open": EventType.OTHER,
    "click": EventType.OTHER,
}


def parse_verification_key(raw: str) -> VerificationKey:
    """The P-256 public key of SendGrid's verification key text (base64 DER, no PEM armour).

    Raises:
        InvalidWebhookSecret: not base64, not a DER public key, or not a P-256 key. The message
            never repeats the key.
    """
    text = "".join(raw.split())
    try:
        der = base64.b64decode(text, validate=True)
        key = load_der_public_key(der)
    except (binascii.Error, ValueError, UnsupportedAlgorithm) as e:
        raise InvalidWebhookSecret(
            "a SendGrid verification key must be the base64 DER public key from its settings"
        ) from e
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
        raise InvalidWebhookSecret("a SendGrid verification key must be an ECDSA P-256 key")
    return key


@dataclass(frozen=True)
class SignedBatch:
    """The timestamp and signature headers of a request (None where absent) and its raw body."""

    timestamp: str | None
    signature: str | None
    body: bytes


def signed_batch(headers: Mapping[str, str], body: bytes) -> SignedBatch:
    """The request's signed values, looked up by lower-case name (Starlette matches any case)."""
    return SignedBatch(headers.get(TIMESTAMP_HEADER), headers.get(SIGNATURE_HEADER), body)


def verify(
    request: SignedBatch, keys: Sequence[VerificationKey], now: datetime, tolerance: timedelta
) -> Verdict:
    """Checks the signature against every key and the timestamp against `now`.

    MISSING: a header is absent or the timestamp is not Unix seconds; EXPIRED: the timestamp is
    more than `tolerance` ahead of `now` or more than `max(tolerance, RETRY_PERIOD)` behind it
    (checked before any signature, so a replay costs no curve arithmetic); FORGED: the signature
    is not base64 or verifies under no key.
    """
    if (
        request.timestamp is None
        or request.signature is None
        or not _TIMESTAMP.fullmatch(request.timestamp)
    ):
        return Verdict.MISSING
    # compared as seconds: a far-off stamp must be refused, not overflow a datetime
    age = now.timestamp() - int(request.timestamp)
    if age > max(tolerance, RETRY_PERIOD).total_seconds() or -age > tolerance.total_seconds():
        return Verdict.EXPIRED
    text = request.signature.strip()
    if len(text) > _MAX_SIGNATURE_CHARS:
        return Verdict.FORGED
    try:
        signature = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return Verdict.FORGED
    signed = request.timestamp.encode("ascii") + request.body
    for key in keys:
        try:
            key.verify(signature, signed, ec.ECDSA(hashes.SHA256()))
        except InvalidSignature:
            continue
        return Verdict.ACCEPTED
    return Verdict.FORGED


@dataclass(frozen=True)
class UnreadEvent:
    """An event of a batch that could not be read: its position and why (no content)."""

    index: int
    why: str


@dataclass(frozen=True)
class EventBatch:
    """What a batch held: the events read, in order, and the ones set aside."""

    events: tuple[ProviderEvent, ...]
    unread: tuple[UnreadEvent, ...]


def parse_batch(provider: str, payload: object) -> EventBatch:
    """A SendGrid event batch (a JSON array of event objects), read event by event.

    Raises:
        InvalidEvent: the body is not a JSON array. An event that cannot be read (not an
            object, no `event` name, no `sg_event_id`, a malformed `sg_message_id`) is set aside
            in `EventBatch.unread`; an unknown event name is not an error (OTHER).
    """
    if not isinstance(payload, list):
        raise InvalidEvent("the body is not a JSON array of events")
    events: list[ProviderEvent] = []
    unread: list[UnreadEvent] = []
    for index, entry in enumerate(payload):
        try:
            events.append(parse_event(provider, entry))
        except InvalidEvent as e:
            unread.append(UnreadEvent(index, str(e)))
    return EventBatch(tuple(events), tuple(unread))


def parse_event(provider: str, entry: object) -> ProviderEvent:
    """One SendGrid event object as a `ProviderEvent`.

    Raises:
        InvalidEvent: what is wrong with it, in words that quote nothing from it.
    """
    if not isinstance(entry, dict):
        raise InvalidEvent("the event is not a JSON object")
    name = matching(entry.get("event"), _TYPE_NAME, "the event has no event name")
    event_id = matching(entry.get("sg_event_id"), _EVENT_ID, "the event has no sg_event_id")
    return ProviderEvent(
        provider=provider,
        event_id=event_id,
        type=_event_type(name, entry),
        provider_message_id=_message_id(entry.get("sg_message_id")),
        operation_key=OperationKey.carried(entry.get(KEY_FIELD)),
    )


def _event_type(name: str, entry: dict[str, Any]) -> EventType:
    if name == "bounce":
        kind = entry.get("type")
        return EventType.HARD_BOUNCE if kind == "bounce" else EventType.SOFT_BOUNCE
    if name == "dropped":
        reason = entry.get("reason")
        if isinstance(reason, str):
            return _DROPPED_REASONS.get(reason.strip().lower(), EventType.OTHER)
        return EventType.OTHER
    return _TYPES.get(name, EventType.OTHER)


def _message_id(value: object) -> str | None:
    """`sg_message_id` up to its first `.`: the `X-Message-Id` the send was answered with."""
    if value is None:
        return None
    message_id = matching(value, MESSAGE_ID, "sg_message_id is not a message id")
    return message_id.split(".", 1)[0] or None
