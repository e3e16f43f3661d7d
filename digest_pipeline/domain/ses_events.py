"""Amazon SES's event records, as SNS delivers them to `/events/ses`, read as provider events.

SES event publishing (a configuration set's SNS event destination) writes `eventType`; the older
identity feedback notifications write `notificationType` and carry no tags. Both are read here:

| SES event (`eventType`)                    | read as     | effect                             |
|--------------------------------------------|-------------|------------------------------------|
| Delivery                                   | DELIVERED   | settles `unknown`, confirms `sent` |
| Bounce, Permanent (any `bounceSubType`)    | HARD_BOUNCE | suppresses the customer            |
| Bounce, Transient, Undetermined or no type | SOFT_BOUNCE | recorded only                      |
| Complaint                                  | COMPLAINT   | suppresses the customer            |
| Complaint, feedback type `not-spam`        | OTHER       | recorded only                      |
| DeliveryDelay                              | SOFT_BOUNCE | recorded only                      |
| Reject                                     | OTHER       | recorded only                      |
| any other (Send, Open, Click, …)           | OTHER       | recorded only                      |

A suppression is kept for good, so only a stated permanent bounce earns one, as for the other
providers; `OnAccountSuppressionList` is a Permanent subtype: the address is on the account's
suppression list and no digest sent to it will arrive. A `not-spam` feedback report (RFC 6650)
is a mailbox provider saying the recipient marked the message as *not* spam: no complaint.
`DeliveryDelay` means SES is still trying. `Reject` means SES refused to send the message (it
found a virus in it): an `unknown` item stays `unknown` for an operator, with that evidence, as
with SendGrid's `dropped`; nothing was sent that could be reported later.

The event id is the SNS `MessageId` (the same on every SNS retry of one delivery), the message
id `mail.messageId` (the `MessageId` SES answered the send with), and the operation key the
mailer's `operation_key` tag (domain/ses_tags.py), else our `X-Digest-Operation-Key` header in
`mail.headers` (present when the event destination includes the original headers).
"""

import re
from typing import Any

from digest_pipeline.domain.errors import InvalidOperationKey
from digest_pipeline.domain.feedback import (
    MESSAGE_ID,
    EventType,
    InvalidEvent,
    ProviderEvent,
    matching,
)
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.domain.ses_tags import TAG_NAME, key_of_tag

#: the provider name SES's events and their ledger rows go by
PROVIDER = "ses"
#: `Rendering Failure` is the one name with a space
_TYPE_NAME = re.compile(r"[A-Za-z][A-Za-z ]{0,63}")
_KEY_HEADER = "x-digest-operation-key"
_PERMANENT = "Permanent"
_NOT_SPAM = "not-spam"

#: event names read without looking further than the name; Bounce and Complaint look inside
_TYPES: dict[str, EventType] = {
    "Delivery": EventType.DELIVERED,
    "DeliveryDelay": EventType.SOFT_BOUNCE,
    "Reject": EventType.OTHER,
    "Send": EventType.OTHER,
    "Open": EventType.OTHER,
    "Click": EventType.OTHER,
    "Rendering Failure": EventType.OTHER,
    "Subscription": EventType.OTHER,
}


def parse_ses_event(event_id: str, payload: object) -> ProviderEvent:
    """An SES event record (the SNS message's `Message`, decoded) as a provider event.

    Raises:
        InvalidEvent: not an object with an event name, a `mail` object and a printable
            `mail.messageId`. The reason quotes nothing from the record. An unknown event name
            is not an error (OTHER).
    """
    if not isinstance(payload, dict):
        raise InvalidEvent("the SES event is not a JSON object")
    name = matching(
        payload.get("eventType", payload.get("notificationType")),
        _TYPE_NAME,
        "the SES event has no eventType",
    )
    mail = payload.get("mail")
    if not isinstance(mail, dict):
        raise InvalidEvent("the SES event has no mail object")
    message_id = matching(mail.get("messageId"), MESSAGE_ID, "mail.messageId is not a message id")
    return ProviderEvent(
        provider=PROVIDER,
        event_id=event_id,
        type=_event_type(name, payload),
        provider_message_id=message_id,
        operation_key=_carried_key(mail),
    )


def _event_type(name: str, payload: dict[str, Any]) -> EventType:
    if name == "Bounce":
        bounce = payload.get("bounce")
        kind = bounce.get("bounceType") if isinstance(bounce, dict) else None
        return EventType.HARD_BOUNCE if kind == _PERMANENT else EventType.SOFT_BOUNCE
    if name == "Complaint":
        complaint = payload.get("complaint")
        feedback = complaint.get("complaintFeedbackType") if isinstance(complaint, dict) else None
        return EventType.OTHER if feedback == _NOT_SPAM else EventType.COMPLAINT
    return _TYPES.get(name, EventType.OTHER)


def _carried_key(mail: dict[str, Any]) -> OperationKey | None:
    """The key the mailer tagged the message with, else the one in our header; None if neither."""
    tags = mail.get("tags")
    values = tags.get(TAG_NAME) if isinstance(tags, dict) else None
    for value in values if isinstance(values, list) else []:
        try:
            return key_of_tag(value)
        except InvalidOperationKey:
            continue
    headers = mail.get("headers")
    for header in headers if isinstance(headers, list) else []:
        if not isinstance(header, dict):
            continue
        name, value = header.get("name"), header.get("value")
        key_header = isinstance(name, str) and name.lower() == _KEY_HEADER
        if key_header and (key := OperationKey.carried(value)) is not None:
            return key
    return None
