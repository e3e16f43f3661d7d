"""SNS message verification: AWS's signatures accepted, every forgery and misdirection refused.

Messages are signed by digest_pipeline_tests/sns_signing.py, written from AWS's documentation,
and two messages signed by AWS itself (with the certificate AWS published for them) are checked
too. Certificates are fetched by the product's own `HttpsFetcher` over real TLS from a loopback
server whose certificate a throwaway CA issued; the server records every GET, so a refusal that
must come before any fetch is shown to have fetched nothing.
"""

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from digest_pipeline.adapters.webhooks.sns import (
    SNS_RETRY_SPAN,
    CertificateUnavailable,
    Check,
    FetchFailed,
    HttpsFetcher,
    MessageType,
    SnsVerifier,
    parse_message,
)
from digest_pipeline.domain.feedback import InvalidEvent
from digest_pipeline.domain.webhooks import DEFAULT_TOLERANCE, Verdict
from digest_pipeline.rigs.servers.loopback import free_port
from digest_pipeline.setting_values import InvalidSetting
from digest_pipeline.sns_settings import DEFAULT_CERT_HOST_PATTERN, read_sns
from digest_pipeline_tests.sns_signing import (
    AWS_CERT_PEM,
    AWS_SIGNED,
    AWS_TOPIC_1,
    AWS_TOPIC_2,
    CERT_PATH,
    OTHER_TOPIC,
    TOPIC,
    LoopbackHttps,
    loopback_https,
    sign,
    signing_identity,
    sns_timestamp,
)

NOW = datetime(2026, 10, 19, 6, 0, tzinfo=UTC)
SNS = signing_identity()
STRANGER = signing_identity()
SES_EVENT = json.dumps({"eventType": "Delivery", "mail": {"messageId": "0100-a"}})


@pytest.fixture
def https() -> Any:
    with loopback_https() as server:
        server.serve(CERT_PATH, SNS.cert_pem)
        yield server


def verifier(
    server: LoopbackHttps, *, pattern: str | None = None, topics: tuple[str, ...] = (TOPIC,)
) -> SnsVerifier:
    return SnsVerifier(
        topics=frozenset(topics),
        host_pattern=re.compile(pattern or server.host_pattern),
        fetcher=HttpsFetcher(verify=server.client_context),
        tolerance=DEFAULT_TOLERANCE,
    )


def notification(cert_url: str, *, at: datetime = NOW, **fields: str) -> dict[str, Any]:
    return {
        "Type": "Notification",
        "MessageId": "6f1d2b0e-31c7-5b43-9f57-7a8c0b1f2e3d",
        "TopicArn": TOPIC,
        "Message": SES_EVENT,
        "Timestamp": sns_timestamp(at),
        "SigningCertURL": cert_url,
        "UnsubscribeURL": "https://sns.eu-west-1.amazonaws.com/?Action=Unsubscribe",
        **fields,
    }


def confirmation(cert_url: str, subscribe_url: str, *, at: datetime = NOW) -> dict[str, Any]:
    return {
        "Type": "SubscriptionConfirmation",
        "MessageId": "165545c9-2a5c-472c-8df2-7ff2be2b3b1b",
        "Token": "2336412f37fb687f5d51e6e241d09c805a5a57b30d712f794cc5f6a988666d92768dd60a",
        "TopicArn": TOPIC,
        "Message": "You have chosen to subscribe to the topic. To confirm, visit the SubscribeURL.",
        "SubscribeURL": subscribe_url,
        "Timestamp": sns_timestamp(at),
        "SigningCertURL": cert_url,
    }


def check(v: SnsVerifier, message: dict[str, Any], now: datetime = NOW) -> Check:
    body = json.dumps(message).encode()
    return v.verify(parse_message(body, message["Type"]), now)


class TestAccepted:
    @pytest.mark.parametrize("version", ["1", "2"])
    def test_a_message_signed_as_aws_signs_is_accepted(self, https, version):
        message = sign(notification(https.url(CERT_PATH)), SNS.key, version)

        assert check(verifier(https), message) == Check(Verdict.ACCEPTED)

    def test_the_subject_and_any_text_in_the_message_are_signed_as_sent(self, https):
        message = notification(
            https.url(CERT_PATH), Subject="Amazon SES Email Event", Message='{"a": "é\\n"}\n\t'
        )

        assert check(verifier(https), sign(message, SNS.key)).verdict is Verdict.ACCEPTED

    def test_a_retry_an_hour_later_is_accepted(self, https):
        message = sign(notification(https.url(CERT_PATH), at=NOW - SNS_RETRY_SPAN), SNS.key)

        assert check(verifier(https), message).verdict is Verdict.ACCEPTED

    def test_a_confirmation_is_verified_with_its_own_fields(self, https):
        confirm = https.url("/?Action=ConfirmSubscription&Token=2336")
        message = sign(confirmation(https.url(CERT_PATH), confirm), SNS.key)

        assert check(verifier(https), message).verdict is Verdict.ACCEPTED

    def test_a_certificate_is_fetched_once_per_url(self, https):
        v = verifier(https)
        for n in range(3):
            message = notification(https.url(CERT_PATH), MessageId=f"id-{n}")
            assert check(v, sign(message, SNS.key)).verdict is Verdict.ACCEPTED

        assert https.gets == [CERT_PATH]


class TestRefusedAfterTheFetch:
    def test_a_message_signed_by_another_key_is_forged(self, https):
        message = sign(notification(https.url(CERT_PATH)), STRANGER.key)

        assert check(verifier(https), message) == Check(Verdict.FORGED, "signature")

    @pytest.mark.parametrize(
        ("name", "value"),
        [
            ("Message", SES_EVENT.replace("Delivery", "Bounce")),
            ("MessageId", "6f1d2b0e-31c7-5b43-9f57-7a8c0b1f2e3e"),
            ("Timestamp", sns_timestamp(NOW + timedelta(seconds=1))),
            ("TopicArn", OTHER_TOPIC),
            ("Subject", "added after signing"),
        ],
    )
    def test_a_field_changed_after_signing_is_forged(self, https, name, value):
        message = {**sign(notification(https.url(CERT_PATH)), SNS.key), name: value}
        v = verifier(https, topics=(TOPIC, OTHER_TOPIC))

        assert check(v, message) == Check(Verdict.FORGED, "signature")

    def test_a_signature_that_is_not_base64_is_forged(self, https):
        message = {**sign(notification(https.url(CERT_PATH)), SNS.key), "Signature": "not*base64"}

        assert check(verifier(https), message) == Check(Verdict.FORGED, "signature")

    def test_a_certificate_not_valid_at_the_message_time_is_refused(self, https):
        old = signing_identity(NOW - timedelta(days=400), NOW - timedelta(days=35))
        url = https.serve("/SimpleNotificationService-expired.pem", old.cert_pem)

        assert check(verifier(https), sign(notification(url), old.key)) == Check(
            Verdict.FORGED, "certificate"
        )


class TestRefusedBeforeAnyFetch:
    """Each of these is decided on the message alone: the server is never asked."""

    def test_a_disallowed_topic_is_refused_though_well_signed(self, https):
        message = sign(notification(https.url(CERT_PATH), TopicArn=OTHER_TOPIC), SNS.key)

        assert check(verifier(https), message) == Check(Verdict.FORGED, "topic")
        assert https.gets == []

    @pytest.mark.parametrize("version", ["3", "", "01", "2 "])
    def test_an_unknown_signature_version_is_refused(self, https, version):
        message = {**sign(notification(https.url(CERT_PATH)), SNS.key), "SignatureVersion": version}

        assert check(verifier(https), message) == Check(Verdict.FORGED, "signature_version")
        assert https.gets == []

    @pytest.mark.parametrize(
        "url",
        [
            pytest.param("http://127.0.0.1:{port}" + CERT_PATH, id="http"),
            pytest.param("https://sns.example.com" + CERT_PATH, id="other-host"),
            pytest.param("https://127.0.0.1:{port}.example.com" + CERT_PATH, id="host-suffix"),
            pytest.param("https://sns@127.0.0.1:{port}" + CERT_PATH, id="userinfo"),
            pytest.param("https://127.0.0.1:{port}\\@example.com" + CERT_PATH, id="backslash"),
            pytest.param("https://127.0.0.1:{port}/cert.key", id="not-pem"),
            pytest.param("https://127.0.0.1:{port}:1" + CERT_PATH, id="bad-port"),
        ],
    )
    def test_a_certificate_url_off_the_pattern_is_refused(self, https, url):
        message = sign(notification(url.format(port=https.port)), SNS.key)

        assert check(verifier(https), message) == Check(Verdict.FORGED, "cert_url")
        assert https.gets == []

    def test_a_port_is_refused_unless_the_pattern_names_it(self, https):
        message = sign(notification(https.url(CERT_PATH)), SNS.key)

        refused = check(verifier(https, pattern=r"127\.0\.0\.1"), message)

        assert refused == Check(Verdict.FORGED, "cert_url")
        assert https.gets == []

    @pytest.mark.parametrize(
        "at",
        [
            pytest.param(NOW - SNS_RETRY_SPAN - DEFAULT_TOLERANCE - timedelta(seconds=1), id="old"),
            pytest.param(NOW + DEFAULT_TOLERANCE + timedelta(seconds=1), id="future"),
        ],
    )
    def test_a_timestamp_outside_the_window_is_expired(self, https, at):
        message = sign(notification(https.url(CERT_PATH), at=at), SNS.key)

        assert check(verifier(https), message) == Check(Verdict.EXPIRED, "timestamp")
        assert https.gets == []

    def test_a_subscribe_url_off_the_pattern_is_refused(self, https):
        bad = "https://sns.example.com/?Action=ConfirmSubscription&Token=2336"
        message = sign(confirmation(https.url(CERT_PATH), bad), SNS.key)

        assert check(verifier(https), message) == Check(Verdict.FORGED, "subscribe_url")
        assert https.gets == []


class TestCertificateUnavailable:
    """A certificate that cannot be had is never a verdict: the message is retried (503)."""

    def test_a_closed_port(self, https):
        url = f"https://127.0.0.1:{free_port()}{CERT_PATH}"
        message = sign(notification(url), SNS.key)

        with pytest.raises(CertificateUnavailable):
            check(verifier(https, pattern=r"127\.0\.0\.1:[0-9]+"), message)

    @pytest.mark.parametrize(("status", "body"), [(404, b"no"), (302, b""), (200, b"not a pem")])
    def test_an_answer_that_is_not_a_certificate(self, https, status, body):
        url = https.serve("/SimpleNotificationService-odd.pem", body, status)

        with pytest.raises(CertificateUnavailable):
            check(verifier(https), sign(notification(url), SNS.key))

    def test_a_body_over_the_cap(self, https):
        url = https.serve("/SimpleNotificationService-big.pem", SNS.cert_pem + b" " * 70_000)

        with pytest.raises(CertificateUnavailable):
            check(verifier(https), sign(notification(url), SNS.key))

    def test_a_server_the_trust_store_does_not_know(self, https):
        untrusting = SnsVerifier(
            topics=frozenset({TOPIC}),
            host_pattern=re.compile(https.host_pattern),
            fetcher=HttpsFetcher(),  # the production trust roots: the test CA is not among them
            tolerance=DEFAULT_TOLERANCE,
        )

        with pytest.raises(CertificateUnavailable):
            check(untrusting, sign(notification(https.url(CERT_PATH)), SNS.key))
        assert https.gets == []  # the TLS handshake failed before any request was made

    def test_a_subscribe_url_that_fails_raises(self, https):
        confirm = https.serve("/confirm", b"", 500)
        message = sign(confirmation(https.url(CERT_PATH), confirm), SNS.key)
        v = verifier(https)
        parsed = parse_message(json.dumps(message).encode(), message["Type"])
        assert v.verify(parsed, NOW).verdict is Verdict.ACCEPTED

        with pytest.raises(FetchFailed):
            v.confirm(parsed)


class TestParse:
    @pytest.mark.parametrize(
        ("body", "header"),
        [
            pytest.param(b"not json", "Notification", id="not-json"),
            pytest.param(b"[]", "Notification", id="array"),
            pytest.param(json.dumps({"Type": "Other"}).encode(), "Other", id="type"),
            pytest.param(
                json.dumps({"Type": ["Notification"]}).encode(), "Notification", id="list"
            ),
        ],
    )
    def test_a_body_that_is_no_sns_message_is_invalid(self, body, header):
        with pytest.raises(InvalidEvent):
            parse_message(body, header)

    def test_the_type_header_must_agree_with_the_body(self):
        body = json.dumps(sign(notification("https://x" + CERT_PATH), SNS.key)).encode()

        with pytest.raises(InvalidEvent, match="x-amz-sns-message-type"):
            parse_message(body, "SubscriptionConfirmation")
        with pytest.raises(InvalidEvent):
            parse_message(body, None)

    @pytest.mark.parametrize("missing", ["MessageId", "TopicArn", "Signature", "SigningCertURL"])
    def test_a_missing_field_is_invalid(self, missing):
        message = sign(notification("https://x" + CERT_PATH), SNS.key)
        del message[missing]

        with pytest.raises(InvalidEvent, match=missing):
            parse_message(json.dumps(message).encode(), "Notification")

    def test_a_confirmation_needs_its_token_and_subscribe_url(self):
        message = sign(confirmation("https://x" + CERT_PATH, "https://x/"), SNS.key)
        del message["Token"]

        with pytest.raises(InvalidEvent, match="Token"):
            parse_message(json.dumps(message).encode(), "SubscriptionConfirmation")

    @pytest.mark.parametrize("stamp", ["2026-10-19T06:00:00", "2026-10-19 06:00:00Z", "1792389600"])
    def test_a_timestamp_not_in_sns_form_is_invalid(self, stamp):
        message = {**notification("https://x" + CERT_PATH), "Timestamp": stamp}

        with pytest.raises(InvalidEvent, match="Timestamp"):
            parse_message(json.dumps(sign(message, SNS.key)).encode(), "Notification")

    def test_the_parsed_message_keeps_its_type_and_time(self):
        message = sign(notification("https://x" + CERT_PATH), SNS.key)

        parsed = parse_message(json.dumps(message).encode(), "Notification")

        assert (parsed.type, parsed.signed_at) == (MessageType.NOTIFICATION, NOW)


AWS_NOW = datetime(2022, 7, 28, 21, 30, tzinfo=UTC)


class TestMessagesAwsSigned:
    @pytest.fixture
    def aws(self, https):
        url = https.serve(
            "/SimpleNotificationService-7ff5318490ec183fbaddaa2a969abfda.pem", AWS_CERT_PEM
        )
        v = verifier(https, topics=(AWS_TOPIC_1, AWS_TOPIC_2))
        return v, url

    @pytest.mark.parametrize("message", AWS_SIGNED, ids=["v1-sha1", "v2-sha256"])
    def test_a_message_aws_signed_is_accepted(self, aws, message):
        v, url = aws

        assert check(v, {**message, "SigningCertURL": url}, AWS_NOW) == Check(Verdict.ACCEPTED)

    @pytest.mark.parametrize("message", AWS_SIGNED, ids=["v1-sha1", "v2-sha256"])
    @pytest.mark.parametrize("field", ["Message", "MessageId", "Signature"])
    def test_one_byte_changed_is_forged(self, aws, message, field):
        v, url = aws
        text = message[field]
        # the last character of the message, or of the signature before its `=` padding
        at = len(text.rstrip("=")) - 1
        changed = text[:at] + ("B" if text[at] == "A" else "A") + text[at + 1 :]

        refused = check(v, {**message, "SigningCertURL": url, field: changed}, AWS_NOW)

        assert refused == Check(Verdict.FORGED, "signature")


class TestSettings:
    """`DIGEST_SES_TOPIC_ARNS` and `DIGEST_SNS_CERT_HOST_PATTERN` (sns_settings.py)."""

    def test_no_topic_means_no_route(self):
        assert read_sns({}) is None
        assert read_sns({"DIGEST_SES_TOPIC_ARNS": " , "}) is None

    def test_topics_and_the_default_pattern(self):
        env = {"DIGEST_SES_TOPIC_ARNS": f"{TOPIC}, {AWS_TOPIC_1}"}

        sns = read_sns(env)

        assert sns is not None
        assert sns.topic_arns == frozenset({TOPIC, AWS_TOPIC_1})
        assert sns.cert_host_pattern.pattern == DEFAULT_CERT_HOST_PATTERN
        for host in ("sns.us-east-1.amazonaws.com", "sns.cn-north-1.amazonaws.com.cn"):
            assert sns.cert_host_pattern.fullmatch(host)
        for host in (
            "sns.us-east-1.amazonaws.com:8443",
            "sns.us-east-1.amazonaws.com.evil.example",
        ):
            assert not sns.cert_host_pattern.fullmatch(host)

    @pytest.mark.parametrize(
        "arn",
        [
            "arn:aws:sqs:eu-west-1:123456789012:queue",
            "arn:aws:sns:eu-west-1:12345:topic",
            "arn:aws:sns:eu-west-1:123456789012:",
            "arn:aws:sns:eu-west-1:123456789012:topic:subscription-id",
            "topic",
        ],
    )
    def test_an_entry_that_is_no_topic_arn_is_refused_by_position(self, arn):
        with pytest.raises(InvalidSetting, match="DIGEST_SES_TOPIC_ARNS entry 2"):
            read_sns({"DIGEST_SES_TOPIC_ARNS": f"{TOPIC},{arn}"})

    @pytest.mark.parametrize(
        ("pattern", "why"),
        [("sns.(", "not a regular expression"), (".*", "outside AWS"), (r"sns\..*", "outside AWS")],
    )
    def test_a_pattern_that_does_not_compile_or_trusts_anyone_is_refused(self, pattern, why):
        env = {"DIGEST_SES_TOPIC_ARNS": TOPIC, "DIGEST_SNS_CERT_HOST_PATTERN": pattern}

        with pytest.raises(InvalidSetting, match=why) as refused:
            read_sns(env)
        assert "\n" not in str(refused.value)

    def test_a_pattern_for_a_private_endpoint_is_taken(self):
        env = {"DIGEST_SES_TOPIC_ARNS": TOPIC, "DIGEST_SNS_CERT_HOST_PATTERN": r"127\.0\.0\.1:8443"}

        sns = read_sns(env)

        assert sns is not None
        assert sns.cert_host_pattern.fullmatch("127.0.0.1:8443")
