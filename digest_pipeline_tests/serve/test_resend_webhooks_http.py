"""Resend's webhooks as Resend sends them: signed by Svix's own library, under either header family.

Ordinary Resend accounts get `svix-id`/`svix-timestamp`/`svix-signature`, white-label ones the
`webhook-*` names; every request here is signed by `svix`, never by the project's signer. The
week (conftest `site`): customers 1-3 `sent` with a message id, 4-5 `unknown`.
"""

import base64
import json
from datetime import datetime, timedelta
from typing import Any

import pytest

from digest_pipeline.domain.feedback import EventOutcome, EventType, SuppressionReason
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.domain.webhooks import STANDARD_HEADERS, SVIX_HEADERS
from digest_pipeline.rigs.servers.resend_events import webhook_payload
from digest_pipeline_tests.builders import failed_invariants, key_of, state_of
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.serve.conftest import WEBHOOK_SECRET
from digest_pipeline_tests.svix_signing import svix_headers as signed_by_svix

FAMILIES = pytest.mark.parametrize(
    "names", [SVIX_HEADERS, STANDARD_HEADERS], ids=["svix-headers", "webhook-headers"]
)
OTHER_SECRET = "whsec_" + base64.b64encode(b"o" * 24).decode()


def svix_headers(
    names: tuple[str, str, str],
    event_id: str,
    body: bytes,
    at: datetime,
    secret: str = WEBHOOK_SECRET,
) -> dict[str, str]:
    """The headers Svix sends, named `names`, with a signature made by Svix's library."""
    signed = signed_by_svix(names, event_id, body, at, secret)
    return {**signed, "content-type": "application/json"}


def post(site, payload: dict[str, Any], names=SVIX_HEADERS, event_id="msg_2mXa", **signing):
    body = json.dumps(payload).encode()
    at = signing.pop("at", site.clock.now())
    headers = svix_headers(names, event_id, body, at, **signing)
    return site.http.post("/events/resend", content=body, headers=headers)


@FAMILIES
def test_a_svix_signed_delivered_settles_an_unknown_item_under_either_family(site, names):
    response = post(site, webhook_payload("email.delivered", key=key_of(4)), names)

    assert response.status_code == 200
    assert response.json() == {"outcome": "settled_sent"}
    assert state_of(site.ledger, key_of(4)) is DeliveryState.SENT
    (event,) = site.store.provider_events()
    assert (event.event_id, event.type, event.outcome) == (
        "msg_2mXa",
        EventType.DELIVERED,
        EventOutcome.SETTLED_SENT,
    )
    assert failed_invariants(site.ledger, W42, site.clock.now()) == []


@FAMILIES
def test_a_svix_signature_under_another_secret_is_401_and_changes_nothing(site, names):
    before = site.dump()
    payload = webhook_payload("email.delivered", key=key_of(4))
    response = post(site, payload, names, secret=OTHER_SECRET)
    assert (response.status_code, response.json()) == (401, {"error": "signature_forged"})
    assert site.dump() == before


@FAMILIES
@pytest.mark.parametrize("age", [timedelta(minutes=5, seconds=1), -timedelta(minutes=5, seconds=1)])
def test_a_stale_or_early_svix_timestamp_is_401_and_changes_nothing(site, names, age):
    before = site.dump()
    payload = webhook_payload("email.delivered", key=key_of(4))
    response = post(site, payload, names, at=site.clock.now() - age)
    assert (response.status_code, response.json()) == (401, {"error": "signature_expired"})
    assert site.dump() == before


def test_a_request_with_both_families_is_judged_by_its_svix_headers(site):
    body = json.dumps(webhook_payload("email.delivered", key=key_of(5))).encode()
    now = site.clock.now()
    forged_svix = svix_headers(SVIX_HEADERS, "msg_both", body, now, OTHER_SECRET)
    good_standard = svix_headers(STANDARD_HEADERS, "msg_both", body, now)
    before = site.dump()

    refused = site.http.post(
        "/events/resend", content=body, headers={**good_standard, **forged_svix}
    )
    assert refused.status_code == 401
    assert site.dump() == before

    good_svix = svix_headers(SVIX_HEADERS, "msg_both", body, now)
    forged_standard = svix_headers(STANDARD_HEADERS, "msg_both", body, now, OTHER_SECRET)
    taken = site.http.post("/events/resend", content=body, headers={**forged_standard, **good_svix})
    assert taken.json() == {"outcome": "settled_sent"}


def test_email_suppressed_suppresses_the_customer_as_a_hard_bounce(site):
    before = site.ledger.get(key_of(3))
    payload = webhook_payload("email.suppressed", message_id=site.message_id(3))

    response = post(site, payload, event_id="msg_supp")

    assert response.json() == {"outcome": "suppressed"}
    (only,) = site.store.suppressions()
    assert (only.customer_id, only.reason, only.source) == (
        "customer-0003",
        SuppressionReason.HARD_BOUNCE,
        "provider:resend:msg_supp",
    )
    assert site.ledger.get(key_of(3)) == before  # the item's state is not the event's to move


@pytest.mark.parametrize(
    ("resend_type", "bounce"),
    [
        ("email.failed", None),
        ("email.sent", None),
        ("email.opened", None),
        ("email.clicked", None),
        ("email.delivery_delayed", None),
        ("email.bounced", "Undetermined"),
        ("email.bounced", "Mystery"),
    ],
)
def test_a_record_only_event_moves_no_item_and_suppresses_no_one(site, resend_type, bounce):
    # customer 4 is `unknown`: none of these proves delivery, so it stays `unknown`
    payload = webhook_payload(resend_type, key=key_of(4), bounce_type=bounce)
    before = [site.ledger.get(key_of(n)) for n in range(1, 6)]

    response = post(site, payload, event_id="msg_rec1")

    assert response.json() == {"outcome": "recorded"}
    assert [site.ledger.get(key_of(n)) for n in range(1, 6)] == before
    assert site.store.suppressions() == []
    (event,) = site.store.provider_events()
    assert (event.operation_key, event.outcome) == (key_of(4), EventOutcome.RECORDED)
