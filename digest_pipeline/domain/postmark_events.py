"""Postmark's webhook bodies as provider events, and the basic-auth check Postmark's webhooks carry.

Postmark signs nothing: a webhook is authenticated by the `user:password` put in its URL, which
arrives as HTTP basic auth and is compared in constant time with the configured credentials
(`DIGEST_WEBHOOK_SECRETS` entry `postmark=user:password`). A body is read by its `RecordType`:

| Postmark RecordType                              | read as     | effect                          |
|--------------------------------------------------|-------------|---------------------------------|
| Delivery                                         | DELIVERED   | settles `unknown`, confirms sent |
| Bounce with Type HardBounce                      | HARD_BOUNCE | suppresses the customer         |
| Bounce of any other Type                         | SOFT_BOUNCE | recorded only                   |
| SpamComplaint                                    | COMPLAINT   | suppresses the customer         |
| SubscriptionChange, SuppressSending true, reason SpamComplaint | COMPLAINT | suppresses  |
| SubscriptionChange, SuppressSending true, other  | HARD_BOUNCE | suppresses (as Resend's `email.suppressed`) |
| SubscriptionChange, SuppressSending false; Open, Click, anything else | OTHER | recorded only |

The operation key is `Metadata.operation_key` (the mailer's), else our `X-Digest-Operation-Key`
header; the event id is stable across Postmark's retries: `<RecordType>:<ID>` where Postmark
gives an ID (bounces, complaints), else `<RecordType>:<MessageID>` (with `ChangedAt` for a
subscription change, which may happen more than once to one message).
"""

import base64
import binascii
import hmac
import re
from collections.abc import Sequence
from typing import Any

from digest_pipeline.domain.feedback import EventType, InvalidEvent, ProviderEvent, matching
from digest_pipeline.domain.periods import OperationKey

PROVIDER = "postmark"
_MESSAGE_ID = re.compile(r"[A-Za-z0-9._:@<>+=/-]{1,64}")
_RECORD_TYPE = re.compile(r"[A-Za-z]{1,64}")
_STAMP = re.compile(r"[0-9T:.+Z-]{1,40}")
_KEY_HEADER = "x-digest-operation-key"


def basic_auth_matches(authorization: str | None, credentials: Sequence[bytes]) -> bool:
    """Whether an `Authorization: Basic …` header carries one of `credentials` (`user:password`).

    Every configured credential is compared, whatever matched first, in constant time.
    """
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "basic" or not token:
        return False
    try:
        given = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return False
    matched = False
    for expected in credentials:
        matched |= hmac.compare_digest(expected, given)
    return matched


def _event_type(record: str, body: dict[str, Any]) -> EventType:
    if record == "Delivery":
        return EventType.DELIVERED
    if record == "Bounce":
        return EventType.HARD_BOUNCE if body.get("Type") == "HardBounce" else EventType.SOFT_BOUNCE
    if record == "SpamComplaint":
        return EventType.COMPLAINT
    if record == "SubscriptionChange" and body.get("SuppressSending") is True:
        if body.get("SuppressionReason") == "SpamComplaint":
            return EventType.COMPLAINT
        return EventType.HARD_BOUNCE
    return EventType.OTHER


def _key(body: dict[str, Any]) -> OperationKey | None:
    metadata = body.get("Metadata")
    candidates = [metadata.get("operation_key")] if isinstance(metadata, dict) else []
    headers = body.get("Headers")
    for header in headers if isinstance(headers, list) else []:
        if isinstance(header, dict) and str(header.get("Name", "")).lower() == _KEY_HEADER:
            candidates.append(header.get("Value"))
    for text in candidates:
        if (key := OperationKey.carried(text)) is not None:
            return key
    return None


def parse_postmark_event(payload: object) -> ProviderEvent:
    """A Postmark webhook body as an event.

    Raises:
        InvalidEvent: not an object with a `RecordType` and a printable `MessageID`. An unknown
            record type is not an error (OTHER).
    """
    if not isinstance(payload, dict):
        raise InvalidEvent("the body is not a JSON object")
    record = matching(payload.get("RecordType"), _RECORD_TYPE, "the event has no RecordType")
    message_id = matching(payload.get("MessageID"), _MESSAGE_ID, "MessageID is not a message id")
    given_id = payload.get("ID")
    if isinstance(given_id, int) and not isinstance(given_id, bool):
        event_id = f"{record}:{given_id}"
    else:
        event_id = f"{record}:{message_id}"
        changed = payload.get("ChangedAt")
        if (
            record == "SubscriptionChange"
            and isinstance(changed, str)
            and _STAMP.fullmatch(changed)
        ):
            event_id += f":{changed}"
    return ProviderEvent(
        provider=PROVIDER,
        event_id=event_id,
        type=_event_type(record, payload),
        provider_message_id=message_id,
        operation_key=_key(payload),
    )
