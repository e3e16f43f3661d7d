"""Provider webhooks over HTTP: signed, fresh, once per event id, and refused with nothing changed.

The week (conftest `site`): customers 1-3 `sent` with a message id, 4-5 `unknown`. The last
test runs the whole loop with real parts: the HTTP mailer sends to the loopback provider, a
dropped answer leaves an item `unknown`, and the provider's own signed `delivered` webhook
settles it.
"""

import json
from datetime import timedelta

import httpx
import pytest

from digest_pipeline.adapters.mail.http import HttpProviderMailer
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.domain.feedback import EventOutcome, EventType, SuppressionReason
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.rigs.servers.provider_actions import store_then_drop
from digest_pipeline.rigs.servers.provider_server import ProviderServer
from digest_pipeline.rigs.servers.resend_events import webhook_payload
from digest_pipeline.services.feedback import EVENT_LEASE
from digest_pipeline.settings import ProviderSettings
from digest_pipeline_tests.builders import (
    customer_id,
    deliver_all,
    failed_invariants,
    key_of,
    make_deliverer,
    seed_period,
    state_of,
)
from digest_pipeline_tests.conftest import T0, W42
from digest_pipeline_tests.fakes import FakeComposer, FakeMailer, FixedClock
from digest_pipeline_tests.serve.conftest import WEBHOOK_SECRET, running, signed


def delivered(n: int, site=None):
    message_id = site.message_id(n) if site is not None else None
    return webhook_payload("email.delivered", key=key_of(n), message_id=message_id)


def test_delivered_settles_an_unknown_item_as_sent_with_provider_evidence(site):
    response = site.post_event(delivered(4))

    assert response.status_code == 200
    assert response.json() == {"outcome": "settled_sent"}
    item = site.ledger.get(key_of(4))
    assert item is not None
    assert (item.state, item.last_detail) == (DeliveryState.SENT, "reconciled:provider_event")
    (audit,) = [a for a in site.ledger.audit_log(W42) if a.key == key_of(4)]
    assert (audit.action, audit.reason) == ("reconcile", "evidence:provider_event")
    (event,) = site.store.provider_events()
    assert (event.provider, event.event_id, event.type, event.operation_key, event.outcome) == (
        "resend",
        "msg_0001",
        EventType.DELIVERED,
        key_of(4),
        EventOutcome.SETTLED_SENT,
    )
    assert failed_invariants(site.ledger, W42, site.clock.now()) == []


def test_the_same_event_twice_is_applied_once(site):
    first = site.post_event(delivered(5), "msg_0005")
    before = site.dump()
    site.clock.advance(timedelta(minutes=1))
    again = site.post_event(delivered(5), "msg_0005")

    assert first.json() == {"outcome": "settled_sent"}
    assert again.status_code == 200
    assert again.json() == {"outcome": "settled_sent", "duplicate": True}
    assert site.dump() == before


def test_an_event_another_request_is_applying_is_409_with_retry_after_and_changes_nothing(site):
    site.hold_event("resend", "msg_0001", site.clock.now())
    before = site.dump()

    response = site.post_event(delivered(4))

    assert (response.status_code, response.json()) == (409, {"error": "in_progress"})
    assert response.headers["retry-after"] == str(int(EVENT_LEASE.total_seconds()))
    assert site.dump() == before


def test_a_hard_bounce_of_a_sent_item_matched_by_message_id_suppresses_the_customer(site):
    bounce = webhook_payload(
        "email.bounced", message_id=site.message_id(2), bounce_type="Permanent"
    )
    before = site.ledger.get(key_of(2))

    response = site.post_event(bounce, "msg_0102")

    assert response.json() == {"outcome": "suppressed"}
    (only,) = site.store.suppressions()
    assert (only.customer_id, only.reason, only.source) == (
        "customer-0002",
        SuppressionReason.HARD_BOUNCE,
        "provider:resend:msg_0102",
    )
    assert site.ledger.get(key_of(2)) == before  # a sent item stays sent


def test_a_complaint_suppresses_and_a_soft_bounce_is_recorded_only(site):
    complaint = webhook_payload("email.complained", message_id=site.message_id(1))
    soft = webhook_payload("email.bounced", message_id=site.message_id(3), bounce_type="Transient")
    assert site.post_event(complaint, "msg_0201").json() == {"outcome": "suppressed"}
    assert site.post_event(soft, "msg_0202").json() == {"outcome": "recorded"}
    assert [(s.customer_id, s.reason) for s in site.store.suppressions()] == [
        ("customer-0001", SuppressionReason.COMPLAINT)
    ]


def test_an_event_about_no_digest_is_recorded_unmatched(site):
    # the provider account sends other mail too; its events reach the same endpoint
    stray = webhook_payload("email.complained", message_id="em_password_reset_77")
    response = site.post_event(stray, "msg_0301")
    assert response.json() == {"outcome": "unmatched"}
    assert site.store.suppressions() == []


def test_an_event_of_another_digest_instance_is_recorded_unmatched(site):
    # an instance on the same provider account tags its digests `vip_digest_…`; its events
    # reach this endpoint too, and are about another ledger's items
    theirs = OperationKey(W42, customer_id(4), "vip_digest")
    before = site.ledger.get(key_of(4))
    delivered_there = webhook_payload("email.delivered", key=theirs)
    complaint_there = webhook_payload("email.complained", key=theirs)

    assert site.post_event(delivered_there, "msg_0401").json() == {"outcome": "unmatched"}
    assert site.post_event(complaint_there, "msg_0402").json() == {"outcome": "unmatched"}
    assert site.ledger.get(key_of(4)) == before
    assert site.store.suppressions() == []
    assert {e.operation_key for e in site.store.provider_events()} == {theirs}


def test_the_response_carries_no_customer_data(site):
    response = site.post_event(delivered(4, site))
    assert "customer-" not in response.text
    assert "digest:" not in response.text


def _fresh(site) -> bytes:
    return json.dumps(delivered(4)).encode()


@pytest.mark.parametrize(
    "tamper",
    [
        lambda site, h, b: ({**h, "webhook-signature": "v1,AAAA"}, b),  # forged
        lambda site, h, b: (h, b.replace(b"delivered", b"complained")),  # body changed
        lambda site, h, b: ({k: v for k, v in h.items() if k != "webhook-signature"}, b),
        lambda site, h, b: ({k: v for k, v in h.items() if k != "webhook-id"}, b),
        lambda site, h, b: ({k: v for k, v in h.items() if k != "webhook-timestamp"}, b),
        lambda site, h, b: ({**h, "webhook-id": "msg_other"}, b),  # replayed under another id
        lambda site, h, b: (signed("msg_0001", b, site.clock.now(), b"x" * 24), b),  # other key
    ],
    ids=[
        "forged",
        "body-changed",
        "no-signature",
        "no-id",
        "no-timestamp",
        "other-id",
        "other-key",
    ],
)
def test_a_bad_or_missing_signature_is_401_and_changes_nothing(site, tamper):
    body = _fresh(site)
    headers, sent = tamper(site, signed("msg_0001", body, site.clock.now()), body)
    before = site.dump()
    response = site.http.post("/events/resend", content=sent, headers=headers)
    assert response.status_code == 401
    assert site.dump() == before


@pytest.mark.parametrize("age", [timedelta(minutes=5, seconds=1), timedelta(days=1)])
def test_an_expired_or_future_signature_is_401_and_changes_nothing(site, age):
    before = site.dump()
    old = site.post_event(delivered(4), "msg_0401", at=site.clock.now() - age)
    early = site.post_event(delivered(4), "msg_0402", at=site.clock.now() + age)
    assert (old.status_code, early.status_code) == (401, 401)
    assert old.json() == {"error": "signature_expired"}
    assert site.dump() == before


def test_a_captured_request_replayed_later_is_refused_and_inside_the_window_a_duplicate(site):
    body = _fresh(site)
    headers = signed("msg_0501", body, site.clock.now())
    assert site.http.post("/events/resend", content=body, headers=headers).status_code == 200
    after_first = site.dump()
    site.clock.advance(timedelta(minutes=2))  # inside the window: the same event id again
    inside = site.http.post("/events/resend", content=body, headers=headers)
    site.clock.advance(timedelta(minutes=10))  # outside it
    outside = site.http.post("/events/resend", content=body, headers=headers)
    assert inside.json()["duplicate"] is True
    assert outside.status_code == 401
    assert site.dump() == after_first


def test_an_unknown_provider_is_404_and_changes_nothing(site):
    before = site.dump()
    response = site.post_event(delivered(4), provider="postmark")
    assert response.status_code == 404
    assert site.dump() == before


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[]", json.dumps({"type": "email.delivered"}).encode(), b"\xff\xfe"],
    ids=["not-json", "not-an-object", "no-data", "not-utf8"],
)
def test_a_signed_body_that_is_not_an_event_is_400_and_changes_nothing(site, body):
    before = site.dump()
    response = site.post_event(body, "msg_0601")
    assert response.status_code == 400
    assert site.dump() == before


def test_the_provider_rigs_signed_webhook_settles_an_unknown_send(sql_engine_factory):
    """Real parts end to end: HTTP mailer → loopback provider; the provider's webhook → serve."""
    engine = sql_engine_factory("sqlite")
    clock = FixedClock(T0)
    ledger = SqlLedger(engine)
    seed_period(ledger, 3, now=clock.now())
    with ProviderServer(webhook_secret=WEBHOOK_SECRET) as provider:
        # the provider stores customer 2's message, then the connection drops: `unknown`
        provider.script(key_of(2), store_then_drop())
        settings = ProviderSettings(provider.url, provider.api_key, 5.0, timedelta(hours=24))
        with HttpProviderMailer(settings) as mailer:
            deliver_all(make_deliverer(ledger, mailer, clock, composer=FakeComposer()))
        assert state_of(ledger, key_of(2)) is DeliveryState.UNKNOWN
        with running(engine, clock, FakeMailer()) as site:
            stamp = int(clock.now().timestamp())
            url = f"{site.url}/events/resend"
            answers = [
                provider.send_webhook(url, "email.delivered", key_of(n), timestamp=stamp)
                for n in (1, 2, 3)
            ]
            forged = httpx.post(url, content=b"{}", headers={"webhook-id": "msg_x"})
    assert [a.json()["outcome"] for a in answers] == ["confirmed", "settled_sent", "confirmed"]
    assert forged.status_code == 401
    item = ledger.get(key_of(2))
    assert item is not None
    assert (item.state, item.provider_message_id) == (
        DeliveryState.SENT,
        provider.message_id(key_of(2)),
    )
    assert failed_invariants(ledger, W42, clock.now()) == []
