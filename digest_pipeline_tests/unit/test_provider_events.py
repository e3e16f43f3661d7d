"""Reading a Resend-style webhook body, and what each event does (`domain/feedback.py`)."""

import pytest

from digest_pipeline.domain.feedback import (
    Decision,
    EventType,
    InvalidEvent,
    decide,
    parse_event,
)
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.rigs.servers.resend_events import webhook_payload
from digest_pipeline_tests.builders import key_of

KEY = key_of(7)


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (webhook_payload("email.delivered"), EventType.DELIVERED),
        (webhook_payload("email.bounced", bounce_type="Permanent"), EventType.HARD_BOUNCE),
        (webhook_payload("email.bounced"), EventType.HARD_BOUNCE),  # Resend: permanent
        (webhook_payload("email.bounced", bounce_type="Transient"), EventType.SOFT_BOUNCE),
        (webhook_payload("email.bounced", bounce_type="Undetermined"), EventType.SOFT_BOUNCE),
        (webhook_payload("email.delivery_delayed"), EventType.SOFT_BOUNCE),
        (webhook_payload("email.complained"), EventType.COMPLAINT),
        (webhook_payload("email.opened"), EventType.OTHER),
        (webhook_payload("delivered"), EventType.DELIVERED),  # without Resend's prefix
    ],
)
def test_each_type_reads_as_ours(payload, expected):
    assert parse_event("resend", "msg_1", payload).type is expected


def test_the_message_id_and_our_tag_come_back_as_the_key():
    event = parse_event(
        "resend", "msg_1", webhook_payload("email.delivered", key=KEY, message_id="em_000042")
    )
    assert (event.provider_message_id, event.operation_key) == ("em_000042", KEY)


@pytest.mark.parametrize(
    "carried",
    [
        {"headers": [{"name": "X-Digest-Operation-Key", "value": str(KEY)}]},
        {"headers": {"x-digest-operation-key": str(KEY)}},
        {"tags": [{"name": "operation_key", "value": str(KEY).replace(":", "_")}]},
        {"tags": {"operation_key": str(KEY)}},
    ],
)
def test_the_key_is_read_from_our_header_or_tag_in_either_shape(carried):
    event = parse_event("resend", "msg_1", {"type": "email.delivered", "data": carried})
    assert event.operation_key == KEY


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"tags": {"operation_key": "digest_2026-W99_x"}},
        {"tags": {"other": str(KEY)}},
        {"headers": "x"},
    ],
)
def test_an_event_without_a_readable_key_has_none(data):
    assert (
        parse_event("resend", "msg_1", {"type": "email.delivered", "data": data}).operation_key
        is None
    )


@pytest.mark.parametrize(
    "payload",
    [
        [],
        "delivered",
        {"data": {}},
        {"type": 5, "data": {}},
        {"type": "email.delivered"},
        {"type": "email.delivered", "data": []},
        {"type": "email.delivered", "data": {"email_id": 42}},
        {"type": "email.delivered", "data": {"email_id": "has space"}},
        {"type": "x" * 200, "data": {}},
    ],
)
def test_a_body_that_is_not_an_event_is_refused(payload):
    with pytest.raises(InvalidEvent):
        parse_event("resend", "msg_1", payload)


@pytest.mark.parametrize(
    ("event_type", "state", "decision"),
    [
        # only `delivered` looks at the state; it settles nothing but an `unknown` item
        (EventType.DELIVERED, DeliveryState.UNKNOWN, Decision.SETTLE_SENT),
        (EventType.DELIVERED, DeliveryState.SENT, Decision.CONFIRM),
        (EventType.DELIVERED, DeliveryState.CLEANED, Decision.CONFIRM),
        (EventType.DELIVERED, DeliveryState.CLAIMED, Decision.LEAVE),
        (EventType.DELIVERED, DeliveryState.RETRY_SCHEDULED, Decision.LEAVE),
        (EventType.DELIVERED, DeliveryState.FAILED, Decision.LEAVE),
        (EventType.DELIVERED, DeliveryState.PENDING, Decision.LEAVE),
        # a hard bounce or complaint proves a digest reached the provider: suppress, any state
        (EventType.HARD_BOUNCE, DeliveryState.SENT, Decision.SUPPRESS),
        (EventType.HARD_BOUNCE, DeliveryState.UNKNOWN, Decision.SUPPRESS),
        (EventType.COMPLAINT, DeliveryState.CLEANED, Decision.SUPPRESS),
        (EventType.SOFT_BOUNCE, DeliveryState.SENT, Decision.RECORD),
        (EventType.OTHER, DeliveryState.SENT, Decision.RECORD),
        # no item: recorded only, whatever the type
        (EventType.DELIVERED, None, Decision.UNMATCHED),
        (EventType.COMPLAINT, None, Decision.UNMATCHED),
    ],
)
def test_what_an_event_does_depends_on_its_type_and_the_items_state(event_type, state, decision):
    assert decide(event_type, state) is decision
