"""SES events through Amazon SNS over HTTP: verified as AWS documents, each recorded once.

The week (serve conftest `deliver_week`): customers 1-3 `sent` with a message id, 4-5 `unknown`.
The application runs under uvicorn over a real ledger and trusts one SNS topic; its signing
certificate is served by a loopback HTTPS server (digest_pipeline_tests/sns_signing.py) and
fetched by the product's own fetcher, with TLS verified against that server's test CA. SNS
messages are signed here as AWS signs them and sent as SNS sends them (`text/plain`, the
`x-amz-sns-*` headers).
"""

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from digest_pipeline.adapters.sql.feedback import SqlFeedbackStore, concurrent_callers
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.adapters.webhooks.sns import HttpsFetcher
from digest_pipeline.domain.feedback import EventOutcome, EventType, SuppressionReason
from digest_pipeline.domain.ses_tags import tag_value
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.rigs.servers.loopback import free_port
from digest_pipeline.serve.app import ServeConfig, build_app
from digest_pipeline.serve.server import BackgroundServer
from digest_pipeline.services.feedback import EVENT_LEASE
from digest_pipeline.sns_settings import SnsSettings
from digest_pipeline_tests.builders import customer_id, key_of
from digest_pipeline_tests.conftest import SQL_BACKENDS, T0
from digest_pipeline_tests.fakes import FixedClock
from digest_pipeline_tests.serve.conftest import SECRET, OverLedger, deliver_week
from digest_pipeline_tests.sns_signing import (
    CERT_PATH,
    OTHER_TOPIC,
    TOPIC,
    LoopbackHttps,
    loopback_https,
    sign,
    signing_identity,
    sns_timestamp,
)

SNS = signing_identity()
ADDRESS = "customer@mailbox.example"


@dataclass
class Endpoint(OverLedger):
    https: LoopbackHttps
    message_ids: dict[str, str]

    def post(self, message: dict[str, Any], *, message_type: str | None = None) -> httpx.Response:
        headers = {
            "content-type": "text/plain; charset=UTF-8",
            "x-amz-sns-message-type": message_type or message["Type"],
            "x-amz-sns-message-id": message["MessageId"],
            "x-amz-sns-topic-arn": message["TopicArn"],
        }
        body = json.dumps(message).encode()
        return httpx.post(f"{self.url}/events/ses", content=body, headers=headers, timeout=30)


def serving(engine: Engine, clock: FixedClock, https: LoopbackHttps, *, sns: bool = True) -> Any:
    ledger = SqlLedger(engine)
    settings = SnsSettings(frozenset({TOPIC}), re.compile(r"127\.0\.0\.1:[0-9]+"))
    app = build_app(
        config=ServeConfig(
            unsubscribe_secret=SECRET,
            ledger_threads=concurrent_callers(engine),
            sns=settings if sns else None,
            sns_fetcher=HttpsFetcher(verify=https.client_context),
        ),
        store=SqlFeedbackStore(engine),
        ledger=ledger,
        queue=ledger,
        clock=clock,
    )
    return BackgroundServer(app)


@pytest.fixture(params=SQL_BACKENDS)
def endpoint(
    request: pytest.FixtureRequest, sql_engine_factory: Callable[[str], Engine]
) -> Iterator[Endpoint]:
    engine = sql_engine_factory(request.param)
    clock = FixedClock(T0)
    mailer, _ = deliver_week(engine, clock, 5, unknown=(4, 5))
    ids = {k: pid for k, pid, _ in mailer.deliveries}
    with loopback_https() as https, serving(engine, clock, https) as server:
        https.serve(CERT_PATH, SNS.cert_pem)
        yield Endpoint(server.url, engine, https, ids)


def ses_record(event: str, n: int, message_id: str, *, tagged: bool = True, **body: Any):
    mail: dict[str, Any] = {
        "timestamp": sns_timestamp(T0),
        "source": "digest@news.shop.example",
        "messageId": message_id,
        "destination": [ADDRESS],
        "tags": {"ses:configuration-set": ["digest"]},
    }
    if tagged:
        mail["tags"]["operation_key"] = [tag_value(key_of(n))]
    return {"eventType": event, "mail": mail, **body}


def notification(
    endpoint: Endpoint, record: dict[str, Any], sns_id: str, *, topic: str = TOPIC, **fields: str
) -> dict[str, Any]:
    message = {
        "Type": "Notification",
        "MessageId": sns_id,
        "TopicArn": topic,
        "Message": json.dumps(record),
        "Timestamp": sns_timestamp(T0),
        "SigningCertURL": endpoint.https.url(CERT_PATH),
        "UnsubscribeURL": endpoint.https.url("/?Action=Unsubscribe"),
        **fields,
    }
    return sign(message, SNS.key)


def event_for(endpoint: Endpoint, name: str, n: int, sns_id: str, **body: Any) -> dict[str, Any]:
    """A signed notification of SES event `name` about customer `n`'s digest."""
    message_id = endpoint.message_ids.get(str(key_of(n)), f"0100-unknown-{n}")
    return notification(endpoint, ses_record(name, n, message_id, **body), sns_id)


def test_a_delivery_event_settles_an_unknown_item_by_its_tag(endpoint):
    response = endpoint.post(event_for(endpoint, "Delivery", 4, "sns-1"))

    assert (response.status_code, response.json()) == (200, {"outcome": "settled_sent"})
    item = endpoint.ledger.get(key_of(4))
    assert (item.state, item.last_detail) == (DeliveryState.SENT, "reconciled:provider_event")


def test_an_event_another_request_is_applying_is_503_so_sns_retries_and_changes_nothing(endpoint):
    # SNS retries a delivery only after a 5xx; a 409 would end its retries
    endpoint.hold_event("ses", "sns-1", T0)
    before = endpoint.dump()

    response = endpoint.post(event_for(endpoint, "Delivery", 4, "sns-1"))

    assert (response.status_code, response.json()) == (503, {"error": "in_progress"})
    assert response.headers["retry-after"] == str(int(EVENT_LEASE.total_seconds()))
    assert endpoint.dump() == before


def test_a_delivery_event_confirms_a_sent_item_by_its_message_id(endpoint):
    record = ses_record("Delivery", 1, endpoint.message_ids[str(key_of(1))], tagged=False)

    response = endpoint.post(notification(endpoint, record, "sns-1"))

    assert (response.status_code, response.json()) == (200, {"outcome": "confirmed"})
    [stored] = endpoint.store.provider_events()
    assert (stored.provider, stored.event_id, stored.operation_key) == ("ses", "sns-1", key_of(1))
    assert endpoint.ledger.get(key_of(1)).state is DeliveryState.SENT


@pytest.mark.parametrize(
    ("name", "body", "reason"),
    [
        ("Bounce", {"bounce": {"bounceType": "Permanent"}}, SuppressionReason.HARD_BOUNCE),
        (
            "Complaint",
            {"complaint": {"complaintFeedbackType": "abuse"}},
            SuppressionReason.COMPLAINT,
        ),
    ],
)
def test_a_permanent_bounce_or_a_complaint_suppresses_the_customer(endpoint, name, body, reason):
    response = endpoint.post(event_for(endpoint, name, 2, "sns-1", **body))

    assert (response.status_code, response.json()) == (200, {"outcome": "suppressed"})
    assert [(s.customer_id, s.reason) for s in endpoint.store.suppressions()] == [
        (customer_id(2), reason)
    ]


def test_a_transient_bounce_is_recorded_only(endpoint):
    body = {"bounce": {"bounceType": "Transient", "bounceSubType": "MailboxFull"}}

    response = endpoint.post(event_for(endpoint, "Bounce", 2, "sns-1", **body))

    assert response.status_code == 200
    [stored] = endpoint.store.provider_events()
    assert (stored.type, stored.outcome) == (EventType.SOFT_BOUNCE, EventOutcome.RECORDED)
    assert endpoint.store.suppressions() == []


def test_a_reject_leaves_an_unknown_item_for_an_operator(endpoint):
    body = {"reject": {"reason": "Bad content"}}

    response = endpoint.post(event_for(endpoint, "Reject", 5, "sns-1", **body))

    assert response.status_code == 200
    assert endpoint.ledger.get(key_of(5)).state is DeliveryState.UNKNOWN
    [stored] = endpoint.store.provider_events()
    assert (stored.type, stored.operation_key) == (EventType.OTHER, key_of(5))


def test_the_same_sns_message_twice_is_recorded_once(endpoint):
    message = event_for(endpoint, "Bounce", 3, "sns-1", bounce={"bounceType": "Permanent"})
    endpoint.post(message)
    before = endpoint.dump()

    again = endpoint.post(message)

    assert (again.status_code, again.json()) == (200, {"outcome": "suppressed", "duplicate": True})
    assert endpoint.dump() == before
    assert len(endpoint.store.provider_events()) == 1


def test_a_subscription_confirmation_gets_its_url_once_and_records_nothing(endpoint):
    before = endpoint.dump()
    confirm = endpoint.https.serve("/", b"<ConfirmSubscriptionResponse/>")
    message = sign(
        {
            "Type": "SubscriptionConfirmation",
            "MessageId": "165545c9-2a5c-472c-8df2-7ff2be2b3b1b",
            "Token": "2336412f37fb687f5d51e6e241d09c805a5a57b30d712f794cc5f6a98",
            "TopicArn": TOPIC,
            "Message": "You have chosen to subscribe to the topic.",
            "SubscribeURL": f"{confirm}?Action=ConfirmSubscription&Token=2336412f",
            "Timestamp": sns_timestamp(T0),
            "SigningCertURL": endpoint.https.url(CERT_PATH),
        },
        SNS.key,
    )

    response = endpoint.post(message)

    assert response.status_code == 200
    assert endpoint.https.gets == [CERT_PATH, "/?Action=ConfirmSubscription&Token=2336412f"]
    assert endpoint.dump() == before


def test_a_disallowed_topic_is_refused_and_records_nothing(endpoint):
    before = endpoint.dump()
    message = event_for(endpoint, "Bounce", 2, "sns-1", bounce={"bounceType": "Permanent"})
    forged = sign({**message, "TopicArn": OTHER_TOPIC}, SNS.key)

    response = endpoint.post(forged)

    assert (response.status_code, response.json()) == (401, {"error": "signature_forged"})
    assert endpoint.dump() == before
    assert endpoint.https.gets == []


def test_a_certificate_that_cannot_be_fetched_is_retried_and_records_nothing(endpoint):
    before = endpoint.dump()
    record = ses_record("Delivery", 4, "0100-unknown-4")
    unreachable = f"https://127.0.0.1:{free_port()}{CERT_PATH}"
    message = notification(endpoint, record, "sns-1", SigningCertURL=unreachable)

    response = endpoint.post(message)

    assert (response.status_code, response.json()) == (503, {"error": "unavailable"})
    assert endpoint.dump() == before


def test_a_type_header_that_disagrees_with_the_body_is_a_bad_request(endpoint):
    message = event_for(endpoint, "Delivery", 4, "sns-1")

    response = endpoint.post(message, message_type="SubscriptionConfirmation")

    assert response.status_code == 400
    assert endpoint.store.provider_events() == []


def test_without_sns_settings_the_route_is_not_found(sql_engine_factory):
    engine = sql_engine_factory("sqlite")
    with loopback_https() as https, serving(engine, FixedClock(T0), https, sns=False) as server:
        response = httpx.post(f"{server.url}/events/ses", content=b"{}")

    assert response.status_code == 404
