"""A bounded load test: 10,000 unsubscribes and webhook events at once, nothing lost, none twice.

The real `digest serve` command in its own process (uvicorn, the configured ledger, the system
clock), so the client's event loop and the server's do not share one interpreter. 3,000 customers, of whom 1-1,000 are `unknown` and the rest `sent`. At most 64 requests are in
flight (an `httpx.AsyncClient` behind a semaphore), in a shuffled order:

* 4,000 unsubscribes: customers 1-2,000, each twice;
* 6,000 events, 3,000 distinct ids each sent twice: `delivered` for 1-2,000 (settles 1-1,000,
  confirms the rest), a complaint for 2,001-2,500, a soft bounce for 2,501-3,000.

The assertions are on what the stores hold, never on timings: every event recorded once with
its outcome, every customer suppressed once with the right reason, every `unknown` item settled
once (one audit row each), and the invariants hold. A repeat of an event id may be answered
409 while the first is being applied (the provider retries it); nothing else but 200 is right.
A request lost in transit is sent again (up to `SENDS` times), as a real client does.
"""

import asyncio
import json
import random
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest
from sqlalchemy import Engine

from digest_pipeline.adapters.clock import SystemClock
from digest_pipeline.adapters.sql.feedback import SqlFeedbackStore
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.domain.feedback import EventOutcome, SuppressionReason
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.rigs.servers.resend_events import webhook_payload
from digest_pipeline.rigs.servers.serve_process import ServeProcess
from digest_pipeline_tests.builders import (
    SHOP_LINK_SETTINGS,
    customer_id,
    failed_invariants,
    key_of,
)
from digest_pipeline_tests.conftest import SQL_BACKENDS, T0, W42
from digest_pipeline_tests.fakes import FixedClock
from digest_pipeline_tests.serve.conftest import (
    ONE_CLICK,
    ONE_CLICK_BODY,
    SECRET,
    WEBHOOK_SECRET,
    deliver_week,
    link,
    signed,
)

CUSTOMERS = 3_000
UNKNOWN = range(1, 1_001)
UNSUBSCRIBERS = range(1, 2_001)
COMPLAINERS = range(2_001, 2_501)
IN_FLIGHT = 64
#: tries of one request lost in transit before the test reports it
SENDS = 3

Request = tuple[str, str, bytes, dict[str, str]]


@dataclass
class Shop:
    """A delivered week in a ledger, and `digest serve` running on it."""

    engine: Engine
    url: str
    message_ids: dict[str, str]
    server: ServeProcess

    @property
    def store(self) -> SqlFeedbackStore:
        return SqlFeedbackStore(self.engine)


@pytest.fixture(params=SQL_BACKENDS)
def shop(
    request: pytest.FixtureRequest, sql_engine_factory: Callable[[str], Engine]
) -> Iterator[Shop]:
    engine = sql_engine_factory(request.param)
    mailer, _ = deliver_week(engine, FixedClock(T0), CUSTOMERS, unknown=UNKNOWN)
    env = {
        "DIGEST_DATABASE_URL": engine.url.render_as_string(hide_password=False),
        "DIGEST_UNSUBSCRIBE_SECRET": SECRET,
        **SHOP_LINK_SETTINGS,
        "DIGEST_WEBHOOK_SECRETS": f"resend={WEBHOOK_SECRET}",
    }
    with ServeProcess(env) as server:
        message_ids = {k: pid for k, pid, _ in mailer.deliveries}
        yield Shop(engine, server.url, message_ids, server)


def _events(shop: Shop) -> list[Request]:
    events = []
    # the provider signs as it sends: now, by its own clock (the server checks it against its own)
    now = SystemClock().now()
    for n in range(1, CUSTOMERS + 1):
        # an unknown item's send never got a message id back: only the key's tag names it
        message_id = None if n in UNKNOWN else shop.message_ids[str(key_of(n))]
        if n in UNSUBSCRIBERS:
            payload = webhook_payload("email.delivered", key=key_of(n), message_id=message_id)
        elif n in COMPLAINERS:
            payload = webhook_payload("email.complained", key=key_of(n), message_id=message_id)
        else:
            payload = webhook_payload(
                "email.bounced", key=key_of(n), message_id=message_id, bounce_type="Transient"
            )
        body = json.dumps(payload).encode()
        headers = signed(f"msg_{n:06d}", body, now)
        events.append(("event", "/events/resend", body, headers))
    return events


def _requests(shop: Shop) -> list[Request]:
    unsubscribes: list[Request] = [
        ("unsubscribe", link(customer_id(n)), ONE_CLICK_BODY, ONE_CLICK) for n in UNSUBSCRIBERS
    ]
    every = 2 * unsubscribes + 2 * _events(shop)
    random.Random(16).shuffle(every)
    return every


async def _send_all(
    url: str, requests: list[Request]
) -> tuple[Counter[tuple[str, int | str]], Counter[str]]:
    """Each request's final answer (status, or the transport error it gave up on), and the
    transport errors retried on the way.

    A request lost in transit is sent again, as a provider retries a webhook and a mail client
    an unsubscribe: that is what the endpoints' idempotency is for, and the stores show whether
    the repeat was applied once. One error never aborts the others mid-flight.
    """
    gate = asyncio.Semaphore(IN_FLIGHT)
    limits = httpx.Limits(max_connections=IN_FLIGHT, max_keepalive_connections=IN_FLIGHT)
    retried: Counter[str] = Counter()
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:

        async def one(
            kind: str, path: str, body: bytes, headers: dict[str, str]
        ) -> tuple[str, int | str]:
            async with gate:
                for _ in range(SENDS):
                    try:
                        response = await client.post(path, content=body, headers=headers)
                    except httpx.TransportError as e:
                        error = type(e).__name__
                        retried[error] += 1
                        continue
                    return kind, response.status_code
                return kind, error

        answers = await asyncio.gather(*(one(*r) for r in requests))
    return Counter(answers), retried


# about 35 s on SQLite on a 2-core machine (the server's ~3 ms a request); room for a busy one
@pytest.mark.timeout(600)
def test_ten_thousand_concurrent_requests_lose_nothing_and_apply_every_event_once(shop):
    requests = _requests(shop)
    assert len(requests) == 10_000

    answers, retried = asyncio.run(_send_all(shop.url, requests))
    code, log = shop.server.stopped()

    assert set(answers) <= {("unsubscribe", 200), ("event", 200), ("event", 409)}, (
        answers,
        retried,
    )
    assert answers[("unsubscribe", 200)] == 2 * len(UNSUBSCRIBERS)
    # each event id: one 200 for the request that applied it; its repeat 200 or 409
    assert answers[("event", 200)] >= CUSTOMERS
    assert answers[("event", 200)] + answers[("event", 409)] == 2 * CUSTOMERS

    assert code == 0, log
    assert "serve_failed" not in log

    events = shop.store.provider_events()
    assert len(events) == CUSTOMERS
    assert Counter(e.outcome for e in events) == {
        EventOutcome.SETTLED_SENT: len(UNKNOWN),
        EventOutcome.CONFIRMED: len(UNSUBSCRIBERS) - len(UNKNOWN),
        EventOutcome.SUPPRESSED: len(COMPLAINERS),
        EventOutcome.RECORDED: CUSTOMERS - len(UNSUBSCRIBERS) - len(COMPLAINERS),
    }
    assert {e.operation_key for e in events} == {key_of(n) for n in range(1, CUSTOMERS + 1)}

    suppressed = {s.customer_id: s.reason for s in shop.store.suppressions()}
    assert suppressed == {
        **{customer_id(n): SuppressionReason.UNSUBSCRIBED for n in UNSUBSCRIBERS},
        **{customer_id(n): SuppressionReason.COMPLAINT for n in COMPLAINERS},
    }

    ledger = SqlLedger(shop.engine)
    assert ledger.state_counts(W42) == {DeliveryState.SENT: CUSTOMERS}
    settled = Counter(a.key for a in ledger.audit_log(W42) if a.reason == "evidence:provider_event")
    assert settled == dict.fromkeys((key_of(n) for n in UNKNOWN), 1)
    assert failed_invariants(ledger, W42, SystemClock().now()) == []
