"""Postmark's webhooks over HTTP: basic auth checked in constant time, each RecordType read, once.

The week (serve conftest `deliver_week`): customers 1-3 `sent`, 4-5 `unknown`. The application
trusts Postmark's webhooks under `postmark=user:password`; the loopback Postmark server posts
them with basic auth, as Postmark does from the credentials in the webhook URL.
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from digest_pipeline.domain.feedback import EventType, InvalidEvent
from digest_pipeline.domain.postmark_events import parse_postmark_event
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.rigs.servers.postmark_server import PostmarkServer
from digest_pipeline.settings import load_settings
from digest_pipeline_tests.builders import customer_id, key_of
from digest_pipeline_tests.conftest import SQL_BACKENDS, T0
from digest_pipeline_tests.fakes import FixedClock
from digest_pipeline_tests.serve.conftest import OverLedger, deliver_week, running

CREDENTIALS = "postmark-hooks:a-long-webhook-password"


def event(record: str, n: int, **fields: Any) -> dict[str, Any]:
    return {
        "RecordType": record,
        "MessageID": f"00000000-0000-0000-0000-{n:012d}",
        "Metadata": {"operation_key": str(key_of(n))},
        **fields,
    }


@dataclass
class Endpoint(OverLedger):
    postmark: PostmarkServer

    def post(self, body: dict[str, Any], credentials: str | None = CREDENTIALS) -> httpx.Response:
        return self.postmark.send_webhook(
            f"{self.url}/events/postmark", body, credentials=credentials
        )


@pytest.fixture(params=SQL_BACKENDS)
def endpoint(
    request: pytest.FixtureRequest, sql_engine_factory: Callable[[str], Engine]
) -> Iterator[Endpoint]:
    engine = sql_engine_factory(request.param)
    clock = FixedClock(T0)
    mailer, _ = deliver_week(engine, clock, 5, unknown=(4, 5))
    # the credentials as `digest serve` reads them from DIGEST_WEBHOOK_SECRETS
    env = {"DIGEST_WEBHOOK_SECRETS": f"postmark={CREDENTIALS}"}
    keys = load_settings(env, Path(".")).webhook_keys()
    with running(engine, clock, mailer, webhook_keys=keys) as site, PostmarkServer() as postmark:
        yield Endpoint(site.url, engine, postmark)


def test_delivery_settles_an_unknown_item_as_sent(endpoint: Endpoint) -> None:
    response = endpoint.post(event("Delivery", 4))
    assert (response.status_code, response.json()) == (200, {"outcome": "settled_sent"})
    item = endpoint.ledger.get(key_of(4))
    assert item is not None
    assert (item.state, item.last_detail) == (DeliveryState.SENT, "reconciled:provider_event")


def test_the_same_delivery_twice_is_applied_once(endpoint: Endpoint) -> None:
    endpoint.post(event("Delivery", 5))
    again = endpoint.post(event("Delivery", 5))
    assert again.json() == {"outcome": "settled_sent", "duplicate": True}
    assert len(endpoint.store.provider_events()) == 1


@pytest.mark.parametrize(
    ("body", "outcome", "suppressed"),
    [
        (event("Bounce", 2, ID=42, Type="HardBounce"), "suppressed", True),
        (event("Bounce", 2, ID=43, Type="SoftBounce"), "recorded", False),
        (event("SpamComplaint", 2, ID=44, Type="SpamComplaint"), "suppressed", True),
        (
            event(
                "SubscriptionChange", 2, SuppressSending=True, SuppressionReason="ManualSuppression"
            ),
            "suppressed",
            True,
        ),
        (event("SubscriptionChange", 2, SuppressSending=False), "recorded", False),
        (event("Open", 2), "recorded", False),
    ],
    ids=["hard-bounce", "soft-bounce", "complaint", "suppress-sending", "reactivated", "open"],
)
def test_each_record_type_has_its_effect(
    endpoint: Endpoint, body: dict[str, Any], outcome: str, suppressed: bool
) -> None:
    response = endpoint.post(body)
    assert (response.status_code, response.json()) == (200, {"outcome": outcome})
    ids = {s.customer_id for s in endpoint.store.suppressions()}
    assert (customer_id(2) in ids) is suppressed


@pytest.mark.parametrize(
    "credentials",
    [None, "postmark-hooks:a-wrong-webhook-password", "postmark-hooks", "postmark-hooks:"],
    ids=["none", "wrong-password", "no-password", "empty-password"],
)
def test_without_the_credentials_nothing_changes(
    endpoint: Endpoint, credentials: str | None
) -> None:
    response = endpoint.post(event("Delivery", 4), credentials=credentials)
    assert response.status_code == 401
    assert endpoint.store.provider_events() == []
    assert endpoint.ledger.get(key_of(4)).state is DeliveryState.UNKNOWN  # type: ignore[union-attr]


def test_a_body_without_a_record_type_is_refused(endpoint: Endpoint) -> None:
    response = endpoint.post({"MessageID": "x"})
    assert response.status_code == 400
    assert endpoint.store.provider_events() == []


class TestParser:
    def test_event_ids_are_stable_and_distinct_per_record(self) -> None:
        delivery = parse_postmark_event(event("Delivery", 1))
        assert delivery.event_id == parse_postmark_event(event("Delivery", 1)).event_id
        bounce = parse_postmark_event(event("Bounce", 1, ID=7, Type="HardBounce"))
        assert bounce.event_id == "Bounce:7"
        assert delivery.event_id != bounce.event_id
        assert (delivery.type, delivery.operation_key) == (EventType.DELIVERED, key_of(1))

    def test_key_falls_back_to_our_header(self) -> None:
        body = event("Delivery", 3)
        del body["Metadata"]
        body["Headers"] = [{"Name": "X-Digest-Operation-Key", "Value": str(key_of(3))}]
        assert parse_postmark_event(body).operation_key == key_of(3)

    @pytest.mark.parametrize("body", [[], {"RecordType": "Delivery"}, {"MessageID": "m"}])
    def test_malformed_bodies_are_invalid(self, body: object) -> None:
        with pytest.raises(InvalidEvent):
            parse_postmark_event(body)
