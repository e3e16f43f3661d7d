"""SendGrid's signed event batches over HTTP: verified once, each event recorded once, by key.

The week (serve conftest `deliver_week`): customers 1-3 `sent`, 4-5 `unknown`. The application
trusts `sendgrid=<base64 DER public key>`; batches are signed here as SendGrid signs them
(digest_pipeline_tests/unit/test_sendgrid_webhook.py cross-checks that signing against
SendGrid's own verifier).
"""

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from digest_pipeline.adapters.webhooks.sendgrid import SIGNATURE_HEADER, TIMESTAMP_HEADER
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.settings import load_settings
from digest_pipeline_tests.builders import customer_id, key_of
from digest_pipeline_tests.conftest import SQL_BACKENDS, T0
from digest_pipeline_tests.fakes import FixedClock
from digest_pipeline_tests.serve.conftest import OverLedger, deliver_week, running
from digest_pipeline_tests.unit.sendgrid_signing import (
    OTHER,
    PRIVATE,
    PUBLIC_TEXT,
    sign,
)


def event(name: str, n: int, **fields: Any) -> dict[str, Any]:
    return {
        "event": name,
        "sg_event_id": f"ev-{name}-{n}",
        "sg_message_id": f"msg{n}.filter0001.1-2",
        "timestamp": int(T0.timestamp()),
        "operation_key": str(key_of(n)),
        **fields,
    }


class Endpoint(OverLedger):
    def post(self, events: list[dict[str, Any]], signer: Any = PRIVATE) -> httpx.Response:
        body = json.dumps(events).encode()
        timestamp = str(int(T0.timestamp()))
        headers = {
            "content-type": "application/json",
            TIMESTAMP_HEADER: timestamp,
            SIGNATURE_HEADER: sign(signer, timestamp, body),
        }
        return httpx.post(f"{self.url}/events/sendgrid", content=body, headers=headers)


@pytest.fixture(params=SQL_BACKENDS)
def endpoint(
    request: pytest.FixtureRequest, sql_engine_factory: Callable[[str], Engine]
) -> Iterator[Endpoint]:
    engine = sql_engine_factory(request.param)
    clock = FixedClock(T0)
    mailer, _ = deliver_week(engine, clock, 5, unknown=(4, 5))
    # the verification key as `digest serve` reads it from DIGEST_WEBHOOK_SECRETS
    env = {"DIGEST_WEBHOOK_SECRETS": f"sendgrid={PUBLIC_TEXT}"}
    keys = load_settings(env, Path(".")).webhook_keys()
    with running(engine, clock, mailer, webhook_keys=keys) as site:
        yield Endpoint(site.url, engine)


def test_a_signed_batch_settles_unknown_items_and_suppresses_a_hard_bounce(endpoint):
    response = endpoint.post(
        [event("delivered", 4), event("delivered", 5), event("bounce", 2, type="bounce")]
    )

    assert (response.status_code, response.json()) == (200, {"recorded": 3, "unread": 0})
    for n in (4, 5):
        item = endpoint.ledger.get(key_of(n))
        assert item is not None
        assert (item.state, item.last_detail) == (DeliveryState.SENT, "reconciled:provider_event")
    assert {s.customer_id for s in endpoint.store.suppressions()} == {customer_id(2)}


def test_a_batch_sent_again_is_recorded_once(endpoint):
    batch = [event("delivered", 4), event("spamreport", 3)]
    endpoint.post(batch)

    again = endpoint.post(batch)

    assert again.status_code == 200
    assert len(endpoint.store.provider_events()) == 2


def test_one_unreadable_event_does_not_cost_the_others(endpoint):
    response = endpoint.post([{"event": "delivered"}, event("delivered", 4)])

    assert (response.status_code, response.json()) == (200, {"recorded": 1, "unread": 1})
    assert endpoint.ledger.get(key_of(4)).state is DeliveryState.SENT


def test_a_batch_signed_by_another_key_changes_nothing(endpoint):
    response = endpoint.post([event("delivered", 4), event("bounce", 2, type="bounce")], OTHER)

    assert response.status_code == 401
    assert endpoint.store.provider_events() == []
    assert endpoint.store.suppressions() == []
    assert endpoint.ledger.get(key_of(4)).state is DeliveryState.UNKNOWN
