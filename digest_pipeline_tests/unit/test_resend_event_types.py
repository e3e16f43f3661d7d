"""Every Resend email event type, as read (`parse_event`) and what it does (`decide`).

One row per type: what it is read as, and its decision for a `sent` and an `unknown` item. Only
a stated or implied permanent rejection, a complaint or the provider's own suppression may
suppress a customer; only `delivered` may move an item.
"""

import pytest

from digest_pipeline.domain.feedback import (
    RESEND_TYPES,
    SUPPRESSES,
    Decision,
    EventType,
    SuppressionReason,
    decide,
    parse_event,
)
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.rigs.servers.resend_events import webhook_payload

#: (Resend type, bounce type, read as, decision for a sent item, decision for an unknown item)
ROWS = [
    ("email.sent", None, EventType.OTHER, Decision.RECORD, Decision.RECORD),
    ("email.delivered", None, EventType.DELIVERED, Decision.CONFIRM, Decision.SETTLE_SENT),
    ("email.delivery_delayed", None, EventType.SOFT_BOUNCE, Decision.RECORD, Decision.RECORD),
    ("email.complained", None, EventType.COMPLAINT, Decision.SUPPRESS, Decision.SUPPRESS),
    ("email.bounced", "Permanent", EventType.HARD_BOUNCE, Decision.SUPPRESS, Decision.SUPPRESS),
    ("email.bounced", None, EventType.HARD_BOUNCE, Decision.SUPPRESS, Decision.SUPPRESS),
    ("email.bounced", "Transient", EventType.SOFT_BOUNCE, Decision.RECORD, Decision.RECORD),
    ("email.bounced", "Undetermined", EventType.SOFT_BOUNCE, Decision.RECORD, Decision.RECORD),
    # a bounce type Resend may add later is not a stated permanent rejection
    ("email.bounced", "Mystery", EventType.SOFT_BOUNCE, Decision.RECORD, Decision.RECORD),
    ("email.opened", None, EventType.OTHER, Decision.RECORD, Decision.RECORD),
    ("email.clicked", None, EventType.OTHER, Decision.RECORD, Decision.RECORD),
    # on the provider's own suppression list: nothing sent through it will arrive
    ("email.suppressed", None, EventType.HARD_BOUNCE, Decision.SUPPRESS, Decision.SUPPRESS),
    # also sent for account-wide failures (key, domain, quota): never costs a customer
    ("email.failed", None, EventType.OTHER, Decision.RECORD, Decision.RECORD),
    ("email.some_new_type", None, EventType.OTHER, Decision.RECORD, Decision.RECORD),
]


@pytest.mark.parametrize(
    ("resend_type", "bounce", "read_as", "for_sent", "for_unknown"),
    ROWS,
    ids=[f"{r[0]}-{r[1]}" if r[1] else r[0] for r in ROWS],
)
def test_each_resend_type_is_read_and_decided_as_documented(
    resend_type, bounce, read_as, for_sent, for_unknown
):
    event = parse_event("resend", "msg_1", webhook_payload(resend_type, bounce_type=bounce))
    assert event.type is read_as
    assert decide(event.type, DeliveryState.SENT) is for_sent
    assert decide(event.type, DeliveryState.UNKNOWN) is for_unknown
    assert decide(event.type, None) is Decision.UNMATCHED


def test_every_resend_email_type_is_mapped_explicitly():
    listed = {row[0].removeprefix("email.") for row in ROWS} - {"bounced", "some_new_type"}
    assert listed == set(RESEND_TYPES)


def test_a_suppressed_event_suppresses_as_a_hard_bounce():
    event = parse_event("resend", "msg_1", webhook_payload("email.suppressed"))
    assert SUPPRESSES[event.type] is SuppressionReason.HARD_BOUNCE


@pytest.mark.parametrize("event_type", list(EventType))
@pytest.mark.parametrize("state", [s for s in DeliveryState if s is not DeliveryState.UNKNOWN])
def test_only_delivered_settles_and_only_an_unknown_item(event_type, state):
    assert decide(event_type, state) is not Decision.SETTLE_SENT
    settles = decide(event_type, DeliveryState.UNKNOWN) is Decision.SETTLE_SENT
    assert settles == (event_type is EventType.DELIVERED)


@pytest.mark.parametrize("event_type", list(EventType))
@pytest.mark.parametrize("state", list(DeliveryState))
def test_a_type_suppresses_exactly_when_it_names_a_suppression_reason(event_type, state):
    assert (decide(event_type, state) is Decision.SUPPRESS) == (event_type in SUPPRESSES)
