"""SES event records (as SNS delivers them) read as provider events: the table, the key, refusals.

Records are shaped as AWS's "Examples of event data that Amazon SES publishes to Amazon SNS"
shows them: `eventType`, `mail.messageId`, `mail.tags` as lists of strings, `mail.headers` as
name/value objects; the older feedback notifications say `notificationType` and carry no tags.
"""

import json
from typing import Any

import pytest

from digest_pipeline.domain.feedback import EventType, InvalidEvent
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.domain.ses_events import PROVIDER, parse_ses_event
from digest_pipeline.domain.ses_tags import tag_value

KEY = OperationKey.parse("digest:2026-W42:customer-0007")
OTHER_KEY = OperationKey.parse("digest:2026-W42:customer-0008")
ADDRESS = "ana.lima@mailbox.example"
SNS_ID = "6f1d2b0e-31c7-5b43-9f57-7a8c0b1f2e3d"
SES_ID = "0100018b2c7e9f3a-1f0d7c52-8a4b-4c1e-9d2f-5e6a7b8c9d0e-000000"


def record(event: str, *, shape: str = "eventType", **body: Any) -> dict[str, Any]:
    mail: dict[str, Any] = {
        "timestamp": "2026-10-19T06:00:00.000Z",
        "source": "Linden Home <digest@news.shop.example>",
        "messageId": SES_ID,
        "destination": [ADDRESS],
        "headersTruncated": False,
        "tags": {"ses:configuration-set": ["digest"], "operation_key": [tag_value(KEY)]},
    }
    return {shape: event, "mail": mail, **body}


def bounce(kind: str, sub: str = "General") -> dict[str, Any]:
    recipients = [{"emailAddress": ADDRESS, "action": "failed", "status": "5.1.1"}]
    return {"bounce": {"bounceType": kind, "bounceSubType": sub, "bouncedRecipients": recipients}}


class TestEventTable:
    @pytest.mark.parametrize(
        ("name", "body", "expected"),
        [
            # the receiving server accepted the message
            ("Delivery", {"delivery": {"recipients": [ADDRESS]}}, EventType.DELIVERED),
            # a permanent bounce suppresses, whatever its subtype
            ("Bounce", bounce("Permanent"), EventType.HARD_BOUNCE),
            ("Bounce", bounce("Permanent", "NoEmail"), EventType.HARD_BOUNCE),
            ("Bounce", bounce("Permanent", "OnAccountSuppressionList"), EventType.HARD_BOUNCE),
            ("Bounce", bounce("Permanent", "Suppressed"), EventType.HARD_BOUNCE),
            # not permanent, or not said to be: recorded only
            ("Bounce", bounce("Transient", "MailboxFull"), EventType.SOFT_BOUNCE),
            ("Bounce", bounce("Undetermined", "Undetermined"), EventType.SOFT_BOUNCE),
            ("Bounce", bounce("permanent"), EventType.SOFT_BOUNCE),
            ("Bounce", {}, EventType.SOFT_BOUNCE),
            # a spam report suppresses, on the account suppression list too
            ("Complaint", {"complaint": {"complaintFeedbackType": "abuse"}}, EventType.COMPLAINT),
            ("Complaint", {"complaint": {}}, EventType.COMPLAINT),
            (
                "Complaint",
                {"complaint": {"complaintSubType": "OnAccountSuppressionList"}},
                EventType.COMPLAINT,
            ),
            # a report that the recipient marked it as *not* spam is no complaint
            ("Complaint", {"complaint": {"complaintFeedbackType": "not-spam"}}, EventType.OTHER),
            # SES is still trying
            (
                "DeliveryDelay",
                {"deliveryDelay": {"delayType": "MailboxFull"}},
                EventType.SOFT_BOUNCE,
            ),
            # SES refused to send it: an unknown item stays for an operator
            ("Reject", {"reject": {"reason": "Bad content"}}, EventType.OTHER),
            # everything else is recorded only
            ("Send", {"send": {}}, EventType.OTHER),
            ("Open", {"open": {}}, EventType.OTHER),
            ("Click", {"click": {}}, EventType.OTHER),
            ("Rendering Failure", {"failure": {}}, EventType.OTHER),
            ("Subscription", {"subscription": {}}, EventType.OTHER),
            ("SomethingNew", {}, EventType.OTHER),
        ],
    )
    def test_each_event_reads_as_its_type(self, name, body, expected):
        event = parse_ses_event(SNS_ID, record(name, **body))

        assert event.type is expected

    @pytest.mark.parametrize(
        ("name", "body", "expected"),
        [
            ("Delivery", {}, EventType.DELIVERED),
            ("Bounce", bounce("Permanent"), EventType.HARD_BOUNCE),
            ("Complaint", {"complaint": {"complaintFeedbackType": "abuse"}}, EventType.COMPLAINT),
        ],
    )
    def test_the_older_notification_shape_reads_the_same(self, name, body, expected):
        event = parse_ses_event(SNS_ID, record(name, shape="notificationType", **body))

        assert event.type is expected

    def test_the_identities_are_the_sns_message_and_the_ses_message(self):
        event = parse_ses_event(SNS_ID, record("Delivery"))

        assert (event.provider, event.event_id, event.provider_message_id) == (
            PROVIDER,
            SNS_ID,
            SES_ID,
        )


class TestOperationKey:
    def test_from_the_mailers_tag(self):
        assert parse_ses_event(SNS_ID, record("Delivery")).operation_key == KEY

    def test_from_our_header_when_there_is_no_tag(self):
        payload = record("Delivery")
        del payload["mail"]["tags"]["operation_key"]
        payload["mail"]["headers"] = [
            {"name": "From", "value": "digest@news.shop.example"},
            {"name": "X-Digest-Operation-Key", "value": str(OTHER_KEY)},
        ]

        assert parse_ses_event(SNS_ID, payload).operation_key == OTHER_KEY

    def test_the_tag_wins_over_the_header(self):
        payload = record("Delivery")
        payload["mail"]["headers"] = [{"name": "x-digest-operation-key", "value": str(OTHER_KEY)}]

        assert parse_ses_event(SNS_ID, payload).operation_key == KEY

    def test_a_tag_that_is_no_key_falls_back_to_the_header(self):
        payload = record("Delivery")
        payload["mail"]["tags"]["operation_key"] = ["not-an-encoded-key"]
        payload["mail"]["headers"] = [{"name": "X-Digest-Operation-Key", "value": str(OTHER_KEY)}]

        assert parse_ses_event(SNS_ID, payload).operation_key == OTHER_KEY

    @pytest.mark.parametrize(
        "tags",
        [{}, {"operation_key": "not-a-list"}, {"operation_key": [7]}, [], None],
    )
    def test_no_readable_key_is_none_not_an_error(self, tags):
        payload = record("Delivery")
        payload["mail"]["tags"] = tags

        assert parse_ses_event(SNS_ID, payload).operation_key is None


class TestRefusals:
    @pytest.mark.parametrize(
        "payload",
        [
            pytest.param([ADDRESS], id="not-an-object"),
            pytest.param({"mail": {"messageId": SES_ID, "destination": [ADDRESS]}}, id="no-type"),
            pytest.param(
                {"eventType": ADDRESS, "mail": {"messageId": SES_ID}}, id="type-is-address"
            ),
            pytest.param({"eventType": "Delivery", "mail": [ADDRESS]}, id="mail-not-object"),
            pytest.param({"eventType": "Delivery"}, id="no-mail"),
            pytest.param(
                {"eventType": "Delivery", "mail": {"destination": [ADDRESS]}}, id="no-message-id"
            ),
            pytest.param(
                {"eventType": "Delivery", "mail": {"messageId": f"<{ADDRESS} x>"}},
                id="message-id-with-address",
            ),
        ],
    )
    def test_a_malformed_record_is_refused_without_quoting_it(self, payload):
        with pytest.raises(InvalidEvent) as refused:
            parse_ses_event(SNS_ID, payload)

        assert ADDRESS not in str(refused.value)
        assert "@" not in str(refused.value)

    def test_the_record_as_sns_carries_it_is_json_text(self):
        # the SNS Message is a string holding the record; the route decodes it first
        text = json.dumps(record("Delivery"))

        with pytest.raises(InvalidEvent):
            parse_ses_event(SNS_ID, text)
