"""`digest serve` under a real uvicorn on 127.0.0.1, over a real ledger (SQLite; PostgreSQL in the
integration tier), driven by httpx.

`site` is a delivered week of five customers: 1-3 `sent` with a provider message id, 4-5
`unknown` (the provider accepted, the worker saw a timeout). The application runs on its own
fixed clock, so a signed webhook's timestamp is fresh or stale exactly as a test says.
"""

import base64
import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from digest_pipeline.adapters.sql.feedback import SqlFeedbackStore, concurrent_callers
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.domain.feedback import ClaimStatus, EventOutcome, EventRecord, EventType
from digest_pipeline.domain.unsubscribe import unsubscribe_token
from digest_pipeline.domain.webhooks import signature
from digest_pipeline.serve.app import ServeConfig, build_app
from digest_pipeline.serve.server import BackgroundServer
from digest_pipeline.services.feedback import EVENT_LEASE
from digest_pipeline.services.wave import DeliveryReport
from digest_pipeline.settings import ServeLimits
from digest_pipeline_tests.builders import deliver_all, key_of, make_deliverer, seed_period
from digest_pipeline_tests.cli.conftest import dump
from digest_pipeline_tests.conftest import SQL_BACKENDS, T0
from digest_pipeline_tests.fakes import FakeMailer, FixedClock

SECRET = "a-private-secret-for-serve-tests"
WEBHOOK_KEY = b"w" * 24
WEBHOOK_SECRET = "whsec_" + base64.b64encode(WEBHOOK_KEY).decode()
ONE_CLICK = {"content-type": "application/x-www-form-urlencoded"}
ONE_CLICK_BODY = b"List-Unsubscribe=One-Click"


@dataclass
class OverLedger:
    """A running application's ledger, read as a test reads it: its work, feedback and rows."""

    url: str
    engine: Engine

    @property
    def ledger(self) -> SqlLedger:
        return SqlLedger(self.engine)

    @property
    def store(self) -> SqlFeedbackStore:
        return SqlFeedbackStore(self.engine)

    def dump(self) -> dict[str, list[tuple[object, ...]]]:
        return dump(self.engine)

    def hold_event(self, provider: str, event_id: str, at: datetime) -> None:
        """Another request's claim on the event from `at`: it is applying it for a lease."""
        held = EventRecord(
            provider, event_id, EventType.OTHER, None, None, at, EventOutcome.RECEIVED
        )
        assert self.store.begin_event(held, EVENT_LEASE).status is ClaimStatus.NEW


@dataclass
class Site(OverLedger):
    """The running application and what it runs on."""

    clock: FixedClock
    mailer: FakeMailer
    http: httpx.Client
    _message_ids: dict[str, str] | None = None

    def message_id(self, n: int) -> str:
        if self._message_ids is None:
            self._message_ids = {k: pid for k, pid, _ in self.mailer.deliveries}
        return self._message_ids[str(key_of(n))]

    def post_event(
        self,
        payload: Any,
        event_id: str = "msg_0001",
        *,
        at: datetime | None = None,
        key: bytes = WEBHOOK_KEY,
        provider: str = "resend",
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        return self.http.post(
            f"/events/{provider}",
            content=body,
            headers={**signed(event_id, body, at or self.clock.now(), key), **(headers or {})},
        )


def link(customer_id: str, token: str | None = None) -> str:
    """The path of a customer's unsubscribe link (the composer's, without scheme and host)."""
    token = unsubscribe_token(SECRET, customer_id) if token is None else token
    return f"/unsubscribe/{customer_id}?token={token}"


def signed(event_id: str, body: bytes, at: datetime, key: bytes = WEBHOOK_KEY) -> dict[str, str]:
    stamp = int(at.timestamp())
    return {
        "webhook-id": event_id,
        "webhook-timestamp": str(stamp),
        "webhook-signature": signature(key, event_id, stamp, body),
        "content-type": "application/json",
    }


def deliver_week(
    engine: Engine, clock: FixedClock, customers: int, unknown: range | tuple[int, ...]
) -> tuple[FakeMailer, DeliveryReport]:
    """Seeds 2026-W42 for customers 1..`customers` and delivers it; `unknown` time out."""
    ledger = SqlLedger(engine)
    seed_period(ledger, customers, now=clock.now())
    mailer = FakeMailer(clock=clock, can_lookup=False)
    for n in unknown:
        mailer.script_timeout_after_accept(key_of(n))
    report = deliver_all(make_deliverer(ledger, mailer, clock), batch_size=500, concurrency=4)
    return mailer, report


@contextmanager
def running(
    engine: Engine,
    clock: FixedClock,
    mailer: FakeMailer,
    limits: ServeLimits | None = None,
    *,
    webhook_keys: Mapping[str, tuple[bytes, ...]] | None = None,
) -> Iterator[Site]:
    """The application on `engine` under uvicorn on a free loopback port, under `limits`.

    It trusts `webhook_keys` (as `Settings.webhook_keys` reads them), Resend's test key unless
    given.
    """
    ledger = SqlLedger(engine)
    app = build_app(
        config=ServeConfig(
            unsubscribe_secret=SECRET,
            webhook_keys={"resend": (WEBHOOK_KEY,)} if webhook_keys is None else webhook_keys,
            ledger_threads=concurrent_callers(engine),
        ),
        store=SqlFeedbackStore(engine),
        ledger=ledger,
        queue=ledger,
        clock=clock,
    )
    server = BackgroundServer(app, limits=limits)
    with server, httpx.Client(base_url=server.url, timeout=30) as http:
        yield Site(server.url, engine, clock, mailer, http)


@pytest.fixture(params=SQL_BACKENDS)
def site(
    request: pytest.FixtureRequest, sql_engine_factory: Callable[[str], Engine]
) -> Iterator[Site]:
    engine = sql_engine_factory(request.param)
    clock = FixedClock(T0)
    mailer, _ = deliver_week(engine, clock, 5, unknown=(4, 5))
    with running(engine, clock, mailer) as s:
        yield s
