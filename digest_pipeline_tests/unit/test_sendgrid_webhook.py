"""SendGrid's Signed Event Webhook: our verifier against SendGrid's own helper, and batch parsing.

Requests are signed here as SendGrid signs them (ECDSA P-256, SHA-256, over `timestamp + body`,
base64 DER), with a key pair generated per test run, and every verdict is cross-checked with
`sendgrid.helpers.eventwebhook.EventWebhook.verify_signature`. The one place the two differ by
design: SendGrid's helper checks no time, so a correctly signed request older than SendGrid's
retry period, or from the future, passes it and is refused here (`EXPIRED`).
"""

import base64
import json
from datetime import UTC, datetime

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from sendgrid.helpers.eventwebhook import EventWebhook

from digest_pipeline.adapters.webhooks.sendgrid import (
    RETRY_PERIOD,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    EventBatch,
    UnreadEvent,
    Verdict,
    parse_batch,
    parse_event,
    parse_verification_key,
    signed_batch,
    verify,
)
from digest_pipeline.domain.feedback import EventType, InvalidEvent
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.domain.webhooks import DEFAULT_TOLERANCE, InvalidWebhookSecret
from digest_pipeline_tests.unit.sendgrid_signing import (
    OTHER,
    PRIVATE,
    PUBLIC_TEXT,
    sign,
    verification_key_text,
)

NOW = datetime(2026, 10, 19, 6, 0, tzinfo=UTC)
STAMP = str(int(NOW.timestamp()))
KEY = "digest:2026-W42:customer-0007"
#: non-ASCII on purpose: the signed bytes are the body's UTF-8, exactly as sent
BODY = json.dumps(
    [
        {
            "email": "café@mailbox.example",
            "timestamp": 1792389600,
            "event": "delivered",
            "sg_event_id": "ZGVsaXZlcmVkLTAtMjQ5NDg0MTQ",
            "sg_message_id": "14c5d75ce93.filter0001.16648.5515E0B88.0",
            "operation_key": KEY,
        }
    ],
    ensure_ascii=False,
).encode()


def ours(timestamp: str, signature: str, body: bytes, *, keys: tuple[str, ...] = ()) -> Verdict:
    headers = {TIMESTAMP_HEADER: timestamp, SIGNATURE_HEADER: signature}
    parsed = [parse_verification_key(k) for k in keys or (PUBLIC_TEXT,)]
    return verify(signed_batch(headers, body), parsed, NOW, DEFAULT_TOLERANCE)


def sendgrids(timestamp: str, signature: str, body: bytes) -> bool:
    helper = EventWebhook(PUBLIC_TEXT)
    verified: bool = helper.verify_signature(body.decode(), signature, timestamp)
    return verified


#: one second past SendGrid's retry period
PAST = int(RETRY_PERIOD.total_seconds()) + 1


def stale(seconds: int) -> str:
    return str(int(NOW.timestamp()) - seconds)


class TestSignatureAgreesWithSendGridsHelper:
    @pytest.mark.parametrize(
        ("timestamp", "signature", "body", "helper", "verdict"),
        [
            pytest.param(
                STAMP, sign(PRIVATE, STAMP, BODY), BODY, True, Verdict.ACCEPTED, id="accepted"
            ),
            pytest.param(
                STAMP,
                sign(PRIVATE, STAMP, BODY),
                BODY[:-2] + b" ]",
                False,
                Verdict.FORGED,
                id="body-one-byte-changed",
            ),
            pytest.param(
                str(int(STAMP) + 1),
                sign(PRIVATE, STAMP, BODY),
                BODY,
                False,
                Verdict.FORGED,
                id="timestamp-changed",
            ),
            pytest.param(
                STAMP, sign(OTHER, STAMP, BODY), BODY, False, Verdict.FORGED, id="another-key"
            ),
            # SendGrid's helper checks no time: a request signed before its retry period passes it
            pytest.param(
                stale(PAST),
                sign(PRIVATE, stale(PAST), BODY),
                BODY,
                True,
                Verdict.EXPIRED,
                id="older-than-the-retry-period-accepted-by-the-helper-refused-here",
            ),
            # a retry signed when the batch was first sent, hours ago, is still SendGrid's
            pytest.param(
                stale(PAST - 1),
                sign(PRIVATE, stale(PAST - 1), BODY),
                BODY,
                True,
                Verdict.ACCEPTED,
                id="a-retry-at-the-end-of-the-retry-period",
            ),
            pytest.param(
                stale(-301),
                sign(PRIVATE, stale(-301), BODY),
                BODY,
                True,
                Verdict.EXPIRED,
                id="from-the-future",
            ),
            pytest.param(
                stale(-300),
                sign(PRIVATE, stale(-300), BODY),
                BODY,
                True,
                Verdict.ACCEPTED,
                id="ahead-at-the-edge-of-the-tolerance",
            ),
        ],
    )
    def test_verdict(
        self, timestamp: str, signature: str, body: bytes, helper: bool, verdict: Verdict
    ) -> None:
        assert sendgrids(timestamp, signature, body) is helper
        assert ours(timestamp, signature, body) is verdict

    def test_the_second_key_of_a_rotation_is_accepted(self) -> None:
        signature = sign(OTHER, STAMP, BODY)
        keys = (PUBLIC_TEXT, verification_key_text(OTHER))
        assert ours(STAMP, signature, BODY, keys=keys) is Verdict.ACCEPTED
        assert ours(STAMP, signature, BODY) is Verdict.FORGED

    def test_the_headers_are_read_in_any_case_starlette_gives(self) -> None:
        assert signed_batch({"x-twilio-email-event-webhook-timestamp": STAMP}, b"").timestamp == (
            STAMP
        )


class TestMalformedRequests:
    @pytest.mark.parametrize(
        ("headers", "verdict"),
        [
            ({SIGNATURE_HEADER: "AAAA"}, Verdict.MISSING),
            ({TIMESTAMP_HEADER: STAMP}, Verdict.MISSING),
            ({TIMESTAMP_HEADER: "soon", SIGNATURE_HEADER: "AAAA"}, Verdict.MISSING),
            ({TIMESTAMP_HEADER: f"{STAMP}.5", SIGNATURE_HEADER: "AAAA"}, Verdict.MISSING),
            ({TIMESTAMP_HEADER: "9" * 12, SIGNATURE_HEADER: "AAAA"}, Verdict.EXPIRED),
            ({TIMESTAMP_HEADER: STAMP, SIGNATURE_HEADER: "not base64!"}, Verdict.FORGED),
            ({TIMESTAMP_HEADER: STAMP, SIGNATURE_HEADER: "AAAA"}, Verdict.FORGED),
            ({TIMESTAMP_HEADER: STAMP, SIGNATURE_HEADER: "A" * 4000}, Verdict.FORGED),
        ],
        ids=[
            "no-timestamp",
            "no-signature",
            "word-timestamp",
            "fractional-timestamp",
            "far-future",
            "not-base64",
            "not-der",
            "oversized",
        ],
    )
    def test_refused(self, headers: dict[str, str], verdict: Verdict) -> None:
        keys = [parse_verification_key(PUBLIC_TEXT)]
        assert verify(signed_batch(headers, BODY), keys, NOW, DEFAULT_TOLERANCE) is verdict

    def test_no_key_accepts_nothing(self) -> None:
        headers = {TIMESTAMP_HEADER: STAMP, SIGNATURE_HEADER: sign(PRIVATE, STAMP, BODY)}
        assert verify(signed_batch(headers, BODY), [], NOW, DEFAULT_TOLERANCE) is Verdict.FORGED


class TestVerificationKey:
    def test_whitespace_in_a_pasted_key_is_ignored(self) -> None:
        wrapped = "\n".join(PUBLIC_TEXT[i : i + 64] for i in range(0, len(PUBLIC_TEXT), 64))
        assert parse_verification_key(f"  {wrapped}\n") == parse_verification_key(PUBLIC_TEXT)

    @pytest.mark.parametrize(
        "raw",
        [
            "not a key at all",
            base64.b64encode(b"sixteen bytes or more of nothing").decode(),
            verification_key_text(ec.generate_private_key(ec.SECP384R1())),
            f"-----BEGIN PUBLIC KEY-----\n{PUBLIC_TEXT}\n-----END PUBLIC KEY-----",
        ],
        ids=["text", "not-der", "p384", "pem-armour"],
    )
    def test_refused_without_repeating_the_key(self, raw: str) -> None:
        with pytest.raises(InvalidWebhookSecret) as caught:
            parse_verification_key(raw)
        assert raw not in str(caught.value)
        assert PUBLIC_TEXT not in str(caught.value)


def event(name: str, **fields: object) -> dict[str, object]:
    return {
        "email": "someone@mailbox.example",
        "timestamp": 1792389600,
        "event": name,
        "sg_event_id": f"ev-{name}",
        "sg_message_id": "14c5d75ce93.filter0001.16648.5515E0B88.0",
        "operation_key": KEY,
        **fields,
    }


class TestParsing:
    @pytest.mark.parametrize(
        ("entry", "expected"),
        [
            (event("delivered"), EventType.DELIVERED),
            (event("bounce", type="bounce"), EventType.HARD_BOUNCE),
            (event("bounce", type="blocked"), EventType.SOFT_BOUNCE),
            (event("bounce", type="expired"), EventType.SOFT_BOUNCE),
            # a suppression is forever: only a stated permanent bounce earns one
            (event("bounce"), EventType.SOFT_BOUNCE),
            (event("deferred"), EventType.SOFT_BOUNCE),
            (event("dropped", reason="Bounced Address"), EventType.HARD_BOUNCE),
            (event("dropped", reason="Spam Reporting Address"), EventType.COMPLAINT),
            (event("dropped", reason="Unsubscribed Address"), EventType.OTHER),
            (event("dropped", reason="Spam Content"), EventType.OTHER),
            (event("dropped"), EventType.OTHER),
            (event("spamreport"), EventType.COMPLAINT),
            (event("unsubscribe"), EventType.OTHER),
            (event("group_unsubscribe"), EventType.OTHER),
            (event("processed"), EventType.OTHER),
            (event("open"), EventType.OTHER),
            (event("click"), EventType.OTHER),
            (event("something_new"), EventType.OTHER),
        ],
        ids=lambda v: (
            f"{v['event']}-{v.get('type') or v.get('reason')}" if isinstance(v, dict) else ""
        ),
    )
    def test_each_event_maps_as_documented(
        self, entry: dict[str, object], expected: EventType
    ) -> None:
        assert parse_event("sendgrid", entry).type is expected

    def test_identities_come_from_sendgrids_fields(self) -> None:
        parsed = parse_event("sendgrid", event("delivered"))
        assert (parsed.provider, parsed.event_id) == ("sendgrid", "ev-delivered")
        # the X-Message-Id the send was answered with: the part before SendGrid's suffix
        assert parsed.provider_message_id == "14c5d75ce93"
        assert parsed.operation_key == OperationKey.parse(KEY)

    @pytest.mark.parametrize(
        "entry",
        [
            event("delivered", operation_key=None),
            event("delivered", operation_key="digest:not-a-week:c"),
            event("delivered", operation_key=17),
            {k: v for k, v in event("delivered").items() if k != "operation_key"},
        ],
        ids=["null", "malformed", "number", "absent"],
    )
    def test_an_unreadable_key_is_none_and_the_event_still_counts(
        self, entry: dict[str, object]
    ) -> None:
        assert parse_event("sendgrid", entry).operation_key is None

    def test_no_message_id_is_none(self) -> None:
        entry = {k: v for k, v in event("delivered").items() if k != "sg_message_id"}
        assert parse_event("sendgrid", entry).provider_message_id is None

    def test_a_batch_with_one_bad_event_keeps_the_others(self) -> None:
        payload = [
            event("delivered", sg_event_id="a"),
            "not an object",
            event("bounce", type="bounce", sg_event_id="b"),
            event("delivered", sg_event_id=None),
            event("delivered", sg_event_id="c", sg_message_id="has spaces in it"),
            {"sg_event_id": "d"},
            event("spamreport", sg_event_id="e"),
        ]
        batch = parse_batch("sendgrid", payload)
        assert [(e.event_id, e.type) for e in batch.events] == [
            ("a", EventType.DELIVERED),
            ("b", EventType.HARD_BOUNCE),
            ("e", EventType.COMPLAINT),
        ]
        assert batch.unread == (
            UnreadEvent(1, "the event is not a JSON object"),
            UnreadEvent(3, "the event has no sg_event_id"),
            UnreadEvent(4, "sg_message_id is not a message id"),
            UnreadEvent(5, "the event has no event name"),
        )

    @pytest.mark.parametrize("payload", [{}, "delivered", None, 3])
    def test_a_body_that_is_not_an_array_is_refused_whole(self, payload: object) -> None:
        with pytest.raises(InvalidEvent):
            parse_batch("sendgrid", payload)

    def test_an_empty_batch_is_empty(self) -> None:
        assert parse_batch("sendgrid", []) == EventBatch((), ())

    def test_a_signed_body_parses(self) -> None:
        [parsed] = parse_batch("sendgrid", json.loads(BODY)).events
        assert (parsed.type, parsed.operation_key) == (
            EventType.DELIVERED,
            OperationKey.parse(KEY),
        )
