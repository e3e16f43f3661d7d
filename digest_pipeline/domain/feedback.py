"""What customers and the provider tell us after a send: suppressions and provider events.

A suppression is one customer's "send me nothing more" (one-click unsubscribe, a hard bounce, a
complaint, an operator), kept by customer id only, never by address. A provider event is parsed
from a Resend-style webhook body into one of five types, and `decide` says, from the type and the
matched work item's state alone, what it does; the services record that decision.

Every Resend email event, as read here (`RESEND_TYPES`), and what it does to a matched item:

| Resend type                    | read as     | effect                                         |
|--------------------------------|-------------|------------------------------------------------|
| email.delivered                | DELIVERED   | settles an `unknown` item, confirms a sent one |
| email.bounced Permanent        | HARD_BOUNCE | suppresses the customer (`hard_bounce`)        |
| email.bounced with no type     | HARD_BOUNCE | the same: Resend's bounce is permanent         |
| email.bounced Transient        | SOFT_BOUNCE | recorded only                                  |
| email.bounced Undetermined     | SOFT_BOUNCE | recorded only (so is any other bounce type)    |
| email.delivery_delayed         | SOFT_BOUNCE | recorded only: the provider is still retrying  |
| email.complained               | COMPLAINT   | suppresses the customer (`complaint`)          |
| email.suppressed               | HARD_BOUNCE | suppresses the customer (`hard_bounce`)        |
| email.failed                   | OTHER       | recorded only                                  |
| email.sent                     | OTHER       | recorded only                                  |
| email.opened, email.clicked    | OTHER       | recorded only: digests are not tracked         |
| any other type                 | OTHER       | recorded only                                  |

A suppression is kept for good, so only a stated or implied permanent rejection earns one.
`email.suppressed` means the address is on the provider's own suppression list: no digest sent
through it will ever arrive. `email.failed` also comes for account-wide causes (API key, domain
verification, quota), which must not cost a customer, and an invalid address is already refused
by the send call itself (a 422, dead-lettered as permanent). `email.sent` settles nothing, as
the stored types have no `sent`; a `delivered` event or reconciliation settles an `unknown`
item. An event that matches no item is recorded `unmatched`; so is one carrying another digest
instance's key (`vip_digest:…` at the `digest` instance's endpoint): a provider account sends every
instance's events to every endpoint, and that item is another ledger's, not an error here.
"""

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from digest_pipeline.domain.errors import DigestError
from digest_pipeline.domain.model import AuditEntry
from digest_pipeline.domain.periods import INSTANCE_PATTERN, OperationKey, Period
from digest_pipeline.domain.states import DeliveryState


class SuppressionReason(StrEnum):
    """Why a customer gets no more digests; values are the strings stored in SQL."""

    #: the customer's one-click unsubscribe (RFC 8058)
    UNSUBSCRIBED = "unsubscribed"
    #: the provider reported a permanent bounce of a digest to them
    HARD_BOUNCE = "hard_bounce"
    #: the provider reported a spam complaint about a digest
    COMPLAINT = "complaint"
    #: an operator suppressed them (`digest suppress`)
    OPERATOR = "operator"


@dataclass(frozen=True)
class Suppression:
    """One suppressed customer: the first reason recorded wins, later ones change nothing."""

    customer_id: str
    reason: SuppressionReason
    #: what recorded it: `one_click`, `provider:<name>:<event id>` or `operator:<name>`
    source: str
    created_at: datetime


#: the longest suppression source kept (`provider:<name>:<event id>` fits); audit actors are shorter
SOURCE_LENGTH, ACTOR_LENGTH = 200, 128


def suppression_audit(s: Suppression, note: str) -> AuditEntry:
    """The audit row of a suppression: who (its source), whom, why, and the operator's note."""
    reason = f"{s.customer_id}: {s.reason.value}" + (f": {note}" if note else "")
    return AuditEntry(s.created_at, s.source[:ACTOR_LENGTH], "suppress", None, None, None, reason)


def unsuppression_audit(customer_id: str, at: datetime, actor: str, reason: str) -> AuditEntry:
    """The audit row of taking a customer off the list."""
    entry = f"{customer_id}: {reason}"
    return AuditEntry(at, actor[:ACTOR_LENGTH], "unsuppress", None, None, None, entry)


#: complaints above this share of a week's delivered digests fail its WARN check: the rate the
#: large mailbox providers hold bulk senders to (Gmail and Yahoo, 2024)
COMPLAINT_RATE_LIMIT = 0.003


def unsubscribe_window(period: Period) -> tuple[datetime, datetime]:
    """When a one-click unsubscribe counts toward `period`: the week after it ended.

    A week's digest goes out once the week is over and is in the mailboxes for the next week;
    the link names only the customer (it must keep working), so its week is read from the time.
    """
    return period.ends_at, period.ends_at + timedelta(weeks=1)


@dataclass(frozen=True)
class FeedbackCounts:
    """What customers and the provider said about one week's digests (asset metadata)."""

    #: one-click unsubscribes recorded in `unsubscribe_window(period)`
    unsubscribes: int = 0
    #: the week's items with a hard bounce event (`email.suppressed` included)
    hard_bounces: int = 0
    #: the week's items with a spam complaint event
    complaints: int = 0


class EventType(StrEnum):
    """A provider event as the ledger understands it; values are the strings stored in SQL."""

    #: the receiving server accepted the message (`email.delivered`)
    DELIVERED = "delivered"
    #: permanently undeliverable (`email.bounced` Permanent or no type, `email.suppressed`)
    HARD_BOUNCE = "hard_bounce"
    #: not delivered yet or not for sure (`email.bounced` of another type, `delivery_delayed`)
    SOFT_BOUNCE = "soft_bounce"
    #: the recipient marked it as spam (`email.complained`)
    COMPLAINT = "complaint"
    #: any other type (sent, failed, opened, clicked, …): recorded, nothing else
    OTHER = "other"


class EventOutcome(StrEnum):
    """What recording an event did; values are the strings stored in SQL."""

    #: recorded, its effect not applied yet: a crash left it, and the provider's retry resumes it
    RECEIVED = "received"
    #: `delivered` for an `unknown` item: settled as sent (evidence `provider_event`)
    SETTLED_SENT = "settled_sent"
    #: `delivered` for an item already sent (or sent and cleaned)
    CONFIRMED = "confirmed"
    #: `delivered` for an item in a state an event may not move (claimed, retry_scheduled, …)
    NOT_SETTLED = "not_settled"
    #: a hard bounce or complaint: the customer was added to the suppression list
    SUPPRESSED = "suppressed"
    #: a hard bounce or complaint of a customer already suppressed
    ALREADY_SUPPRESSED = "already_suppressed"
    #: a soft bounce or another type: recorded only
    RECORDED = "recorded"
    #: no work item matches the event's message id or operation key: recorded only
    UNMATCHED = "unmatched"


class Decision(StrEnum):
    """What an event does to the ledger, before the store says whether it already had."""

    SETTLE_SENT = "settle_sent"
    CONFIRM = "confirm"
    LEAVE = "leave"
    SUPPRESS = "suppress"
    RECORD = "record"
    UNMATCHED = "unmatched"


#: the suppression each suppressing event type records
SUPPRESSES: dict[EventType, SuppressionReason] = {
    EventType.HARD_BOUNCE: SuppressionReason.HARD_BOUNCE,
    EventType.COMPLAINT: SuppressionReason.COMPLAINT,
}


def decide(event_type: EventType, state: DeliveryState | None) -> Decision:
    """The effect of an event of `event_type` on a matched item in `state` (None: no match).

    Only `delivered` looks at the state: it settles an `unknown` item, confirms a sent one and
    leaves any other alone. A hard bounce (or `email.suppressed`) or complaint suppresses the
    customer whatever the item's state: the event itself proves the provider took a digest for
    that customer (an item may still read `unknown` or `claimed` because the provider's answer
    was lost).
    """
    if state is None:
        return Decision.UNMATCHED
    if event_type is EventType.DELIVERED:
        if state is DeliveryState.UNKNOWN:
            return Decision.SETTLE_SENT
        if state in (DeliveryState.SENT, DeliveryState.CLEANED):
            return Decision.CONFIRM
        return Decision.LEAVE
    if event_type in SUPPRESSES:
        return Decision.SUPPRESS
    return Decision.RECORD


@dataclass(frozen=True)
class ProviderEvent:
    """A webhook event as parsed: who sent it, its id, its type and what names the message."""

    provider: str
    #: the provider's event id (`svix-id` or `webhook-id`): applied once per (provider, id)
    event_id: str
    type: EventType
    #: the provider's id of the message (`data.email_id`), as the ledger stores it on attempts
    provider_message_id: str | None
    #: the operation key the event carries (our tag or header echoed back), if any
    operation_key: OperationKey | None


@dataclass(frozen=True)
class EventRecord:
    """One stored provider event: identities, type, the matched key and the outcome; no address."""

    provider: str
    event_id: str
    type: EventType
    operation_key: OperationKey | None
    provider_message_id: str | None
    received_at: datetime
    outcome: EventOutcome


class ClaimStatus(StrEnum):
    """What `begin_event` found for an event id."""

    #: first sight: recorded as `received`, the caller applies it
    NEW = "new"
    #: recorded earlier but never finished, and its lease ran out: the caller applies it again
    RESUMED = "resumed"
    #: another request is applying it right now: the caller asks the provider to retry later
    IN_PROGRESS = "in_progress"
    #: applied before: the caller changes nothing
    DONE = "done"


@dataclass(frozen=True)
class EventClaim:
    status: ClaimStatus
    #: the recorded outcome, for DONE
    outcome: EventOutcome | None = None


class InvalidEvent(DigestError, ValueError):
    """A webhook body that is not a provider event the project can read (HTTP 400)."""


#: a provider's id of a message as Resend, SendGrid and SES give it (SES's: `0100018b…-000000`):
#: printable, no space, up to the ledger column's 255 characters
MESSAGE_ID = re.compile(r"[A-Za-z0-9._:@<>+=/-]{1,255}")


def matching(value: object, pattern: re.Pattern[str], why: str) -> str:
    """`value` when it is a string that `pattern` matches whole; InvalidEvent(why) otherwise."""
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise InvalidEvent(why)
    return value


#: Resend's email event types (with or without the `email.` prefix) and what they are here;
#: `bounced` is read from its `data.bounce.type` (`_event_type`), any type not listed is OTHER
RESEND_TYPES: dict[str, EventType] = {
    "sent": EventType.OTHER,
    "delivered": EventType.DELIVERED,
    "delivery_delayed": EventType.SOFT_BOUNCE,
    "complained": EventType.COMPLAINT,
    "suppressed": EventType.HARD_BOUNCE,
    "failed": EventType.OTHER,
    "opened": EventType.OTHER,
    "clicked": EventType.OTHER,
}
#: the `data.bounce.type` of a permanent rejection (Resend passes on SES's names)
_PERMANENT_BOUNCE = "permanent"
#: the HTTP mailer's `operation_key` tag: the key with `:` replaced, as Resend tags allow. An
#: instance's name holds no `-`, so the first `-W` is the period's and the parts split one way.
_TAG_KEY = re.compile(rf"({INSTANCE_PATTERN})_([0-9]{{4}}-W[0-9]{{2}})_([A-Za-z0-9._-]{{1,128}})")
_TYPE_NAME = re.compile(r"[a-z_.]{1,64}")
KEY_TAG = "operation_key"
KEY_HEADER = "x-digest-operation-key"


def _pairs(value: object) -> list[tuple[str, object]]:
    """`{"name": value}` or `[{"name": …, "value": …}]` as (lower-case name, value) pairs."""
    if isinstance(value, dict):
        return [(str(k).lower(), v) for k, v in value.items()]
    if isinstance(value, list):
        return [
            (str(p.get("name", "")).lower(), p.get("value")) for p in value if isinstance(p, dict)
        ]
    return []


def _key(text: object) -> OperationKey | None:
    if not isinstance(text, str):
        return None
    tagged = _TAG_KEY.fullmatch(text)
    return OperationKey.carried(":".join(tagged.groups()) if tagged else text)


def _carried_key(data: dict[str, Any]) -> OperationKey | None:
    """The operation key the event echoes: our header first (exact), then our tag."""
    for name, value in _pairs(data.get("headers")):
        if name == KEY_HEADER and (key := _key(value)) is not None:
            return key
    for name, value in _pairs(data.get("tags")):
        if name == KEY_TAG and (key := _key(value)) is not None:
            return key
    return None


def _event_type(name: str, data: dict[str, Any]) -> EventType:
    short = name.removeprefix("email.")
    if short != "bounced":
        return RESEND_TYPES.get(short, EventType.OTHER)
    bounce = data.get("bounce")
    kind = bounce.get("type") if isinstance(bounce, dict) else None
    # Resend sends `email.bounced` for permanent rejections, so no type given is read as one;
    # a stated type other than Permanent (Transient, Undetermined, a new name) suppresses nobody
    if kind is None or (isinstance(kind, str) and kind.lower() == _PERMANENT_BOUNCE):
        return EventType.HARD_BOUNCE
    return EventType.SOFT_BOUNCE


def parse_event(provider: str, event_id: str, payload: object) -> ProviderEvent:
    """A Resend-style webhook body (`{"type": "email.bounced", "data": {…}}`) as an event.

    Raises:
        InvalidEvent: not an object with a string `type` and an object `data`, or a message id
            that is not a short printable string. An unknown type is not an error (OTHER).
    """
    if not isinstance(payload, dict):
        raise InvalidEvent("the body is not a JSON object")
    name, data = payload.get("type"), payload.get("data")
    name = matching(name, _TYPE_NAME, "the event has no type")
    if not isinstance(data, dict):
        raise InvalidEvent("the event has no data object")
    message_id = data.get("email_id")
    if message_id is not None and not (
        isinstance(message_id, str) and MESSAGE_ID.fullmatch(message_id)
    ):
        raise InvalidEvent("data.email_id is not a message id")
    return ProviderEvent(
        provider=provider,
        event_id=event_id,
        type=_event_type(name, data),
        provider_message_id=message_id,
        operation_key=_carried_key(data),
    )
