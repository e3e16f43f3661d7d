"""A real HTTP server on 127.0.0.1 speaking the provider's `POST /emails` API, for tests and rigs.

It honours idempotency keys as Resend does (same key and payload: the same id and nothing stored
again; same key, other payload: 409; a key still in flight: 409), forgets keys after a window,
and can be scripted per key (provider_actions.py) to fail, throttle, hang or drop the connection
after storing. Like Resend, it can also tell a webhook endpoint what became of a message:
`send_webhook` POSTs a Svix-signed `email.delivered` / `email.bounced` / `email.complained` event
(resend_events.py). Like a real account it can enforce a rate limit (`rate_limit`, 429
`rate_limit_exceeded`; rate_window.py) and a daily quota (`daily_quota`, 429
`daily_quota_exceeded`); `stats()` counts what each refused.
"""

import hashlib
import itertools
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from digest_pipeline.rigs.servers.loopback import (
    LoopbackHandler,
    LoopbackHttpd,
    LoopbackServer,
    Received,
)
from digest_pipeline.rigs.servers.provider_actions import Action, ok
from digest_pipeline.rigs.servers.rate_window import Admission, SlidingWindow
from digest_pipeline.rigs.servers.resend_events import signed_headers, webhook_payload


@dataclass(frozen=True)
class Stats:
    """What the server answered to `POST /emails`, counted under its lock (`ProviderServer.stats`)."""

    #: every `POST /emails` arrival: what the rate limit counts
    requests: int
    #: answered 200 with an id: new messages and idempotent replays
    accepted: int
    #: new messages stored: what the daily quota counts
    stored: int
    #: refused with 429 `rate_limit_exceeded`
    rate_limited: int
    #: refused with 429 `daily_quota_exceeded`
    quota_refused: int
    #: arrival times (the server's clock) of the accepted requests, in arrival order
    accepted_at: tuple[float, ...]


@dataclass(frozen=True)
class _Record:
    fingerprint: str
    message_id: str
    stored_at: float


class _Handler(LoopbackHandler):
    date_override: str | None = None
    #: the rate-limit headers of the request being answered (Resend sends them on every answer)
    rate_headers: tuple[tuple[str, str], ...] = ()
    #: when the request being answered arrived, on the provider's clock
    arrived: float = 0.0

    def do_POST(self) -> None:
        owner = self.server.owner
        assert isinstance(owner, ProviderServer)
        owner._handle(self)

    def date_time_string(self, timestamp: float | None = None) -> str:
        return self.date_override or super().date_time_string(timestamp)


class _Httpd(LoopbackHttpd):
    # socketserver's default backlog of 5 resets connections when a burst of senders (a rate
    # limit's test, two processes of 16 threads) connects at once; a provider accepts them all
    request_queue_size = 256


def _reply(
    h: _Handler, code: int, body: dict[str, Any], headers: dict[str, str] | None = None
) -> None:
    data = json.dumps(body).encode()
    h.send_response(code)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(data)))
    for name, value in [*h.rate_headers, *(headers or {}).items()]:
        h.send_header(name, value)
    h.end_headers()
    h.wfile.write(data)


def _error(
    h: _Handler,
    code: int,
    name: str,
    action: Action | None = None,
    *,
    message: str | None = None,
    retry_after: int | None = None,
) -> None:
    headers = {}
    if action is not None and action.retry_after is not None:
        headers["Retry-After"] = action.retry_after
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    h.date_override = action.date if action is not None else None
    text = message or name.replace("_", " ")
    _reply(h, code, {"statusCode": code, "name": name, "message": text}, headers)


class ProviderServer(LoopbackServer):
    """The provider on a free loopback port; use it as a context manager.

    `stored` holds the accepted payloads per idempotency key (a replay adds none), `replays` the
    replays per key, `requests` every request received, `received` each request as read.
    """

    def __init__(
        self,
        *,
        api_key: str = "re_test_4f9c2b7e1d",
        window_seconds: float = 24 * 3600.0,
        clock: Callable[[], float] = time.monotonic,
        latency_seconds: float = 0.0,
        fallback: Action | None = None,
        webhook_secret: str | None = None,
        rate_limit: int | None = None,
        daily_quota: int | None = None,
    ) -> None:
        if daily_quota is not None and daily_quota < 0:
            raise ValueError(f"daily_quota must be 0 or more messages, not {daily_quota}")
        self.api_key = api_key
        #: what `send_webhook` signs with (the endpoint's `DIGEST_WEBHOOK_SECRETS` entry)
        self.webhook_secret = webhook_secret
        self._event_ids = itertools.count(1)
        #: what a request of a key with no script left gets (`ok()` unless given)
        self.fallback = fallback or ok()
        #: every request is answered this long after it was read (a provider's round trip)
        self.latency_seconds = latency_seconds
        self.window_seconds = window_seconds
        self._clock = clock
        #: `POST /emails` requests a sliding second admits (None: no limit; rate_window.py)
        self.rate_limit = rate_limit
        self._window = None if rate_limit is None else SlidingWindow(rate_limit)
        #: new messages stored before every further send is refused (None: no quota)
        self.daily_quota = daily_quota
        super().__init__()
        self._arrivals = 0
        self._accepted_at: list[float] = []
        self._quota_refused = 0
        self._in_flight_changed = threading.Condition(self._lock)
        self._records: dict[str, _Record] = {}
        self._stored: dict[str, list[dict[str, Any]]] = {}
        self._replays: Counter[str] = Counter()
        self._in_flight: set[str] = set()
        self._holds: dict[str, threading.Event] = {}
        self._next_id = 0

    # -- lifecycle ---------------------------------------------------------------------------
    def _new_httpd(self) -> "_Httpd":
        return _Httpd(self, _Handler)

    def _wake(self) -> None:
        with self._lock:
            for event in self._holds.values():
                event.set()
        super()._wake()

    # -- arranging ---------------------------------------------------------------------------
    def release(self, key: object) -> None:
        with self._lock:
            self._holds.setdefault(str(key), threading.Event()).set()

    def wait_in_flight(self, key: object, timeout: float = 5.0) -> bool:
        with self._in_flight_changed:
            return self._in_flight_changed.wait_for(lambda: str(key) in self._in_flight, timeout)

    def send_webhook(
        self,
        url: str,
        event_type: str,
        key: object,
        *,
        timestamp: int,
        event_id: str | None = None,
        bounce_type: str | None = None,
        with_message_id: bool = True,
    ) -> httpx.Response:
        """POSTs a signed event about `key`'s message to `url`, as Resend's webhooks do.

        The message id is the one this server gave the key (when `with_message_id` and it has
        one); `timestamp` is the signing time in Unix seconds (the endpoint's clock decides
        whether it is fresh); `event_id` defaults to a new `msg_…` id.
        """
        if self.webhook_secret is None:
            raise ValueError("ProviderServer(webhook_secret=…) is needed to sign webhooks")
        message_id = self.message_id(key) if with_message_id else None
        payload = webhook_payload(
            event_type, key=key, message_id=message_id, bounce_type=bounce_type
        )
        body = json.dumps(payload).encode()
        event_id = event_id or f"msg_{next(self._event_ids):08d}"
        headers = signed_headers(self.webhook_secret, event_id, timestamp, body)
        return httpx.post(url, content=body, headers=headers, timeout=10.0)

    # -- inspecting --------------------------------------------------------------------------
    @property
    def stored(self) -> dict[str, list[dict[str, Any]]]:
        with self._lock:
            return {k: list(v) for k, v in self._stored.items()}

    def delivered_count(self, key: object) -> int:
        with self._lock:
            return len(self._stored.get(str(key), []))

    def replays(self, key: object) -> int:
        with self._lock:
            return self._replays[str(key)]

    def message_id(self, key: object) -> str | None:
        with self._lock:
            record = self._records.get(str(key))
            return record.message_id if record is not None else None

    @property
    def received(self) -> list[Received]:
        with self._lock:
            return list(self._received)

    def stats(self) -> Stats:
        """The counts of `POST /emails` answers so far, read in one go under the lock."""
        with self._lock:
            return Stats(
                requests=self._arrivals,
                accepted=len(self._accepted_at),
                stored=self._next_id,
                rate_limited=0 if self._window is None else self._window.refused,
                quota_refused=self._quota_refused,
                accepted_at=tuple(self._accepted_at),
            )

    # -- the handler's side ------------------------------------------------------------------
    def _handle(self, h: _Handler) -> None:
        raw = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        key = h.headers.get("Idempotency-Key", "")
        admission: Admission | None = None
        with self._lock:
            self._received.append(Received(h.path, dict(h.headers.items()), body))
            h.arrived = self._clock()
            if h.path == "/emails":
                self._arrivals += 1
                if self._window is not None:
                    admission = self._window.admit(h.arrived)
        h.rate_headers = admission.headers if admission is not None else ()
        if self.latency_seconds:
            time.sleep(self.latency_seconds)
        if h.path != "/emails":
            _error(h, 404, "not_found")
            return
        if admission is not None and admission.refused:
            _error(
                h,
                429,
                "rate_limit_exceeded",
                message=f"Too many requests. You can only make {self.rate_limit} requests per "
                "second. See rate limit response headers for more information.",
                retry_after=admission.retry_after,
            )
            return
        invalid = self._invalid(h, key, body)
        if invalid is not None:
            _error(h, *invalid)
            return
        with self._lock:
            if key in self._in_flight:
                action: Action | None = None
            else:
                action = self._scripted(key, self.fallback)
                if action.kind != "status":
                    self._in_flight.add(key)
                    self._in_flight_changed.notify_all()
        if action is None:
            _error(h, 409, "concurrent_idempotent_requests")
            return
        if action.kind == "status":
            _error(h, action.status, action.name or "error", action)
            return
        self._accept(h, key, body, action)

    def _invalid(self, h: _Handler, key: str, body: Any) -> tuple[int, str] | None:
        """The status and error name of a request Resend would refuse as malformed, or None."""
        auth = h.headers.get("Authorization")
        if auth != f"Bearer {self.api_key}":
            return 401, "missing_api_key" if auth is None else "invalid_api_key"
        if not key:
            return 400, "missing_idempotency_key"
        if not isinstance(body, dict) or not all(f in body for f in ("from", "to", "subject")):
            return 422, "validation_error"
        return None

    def _accept(self, h: _Handler, key: str, body: dict[str, Any], action: Action) -> None:
        quota_spent = False
        try:
            if action.kind == "hold":
                with self._lock:
                    event = self._holds.setdefault(key, threading.Event())
                event.wait(timeout=30)
            with self._lock:
                # checked and stored under one lock, so concurrent sends never overshoot it
                quota_spent = self.daily_quota is not None and self._next_id >= self.daily_quota
                message_id = None if quota_spent else self._store_locked(key, body)
                self._quota_refused += quota_spent
                if message_id is not None:
                    self._accepted_at.append(h.arrived)
        finally:
            with self._lock:
                self._in_flight.discard(key)
        if quota_spent:
            _error(
                h,
                429,
                "daily_quota_exceeded",
                message="You have reached your daily email sending quota.",
            )
            return
        if message_id is None:
            _error(h, 409, "invalid_idempotent_request")
            return
        if self._hold_or_drop(h, action):
            return
        _reply(h, 200, {"object": "email"} if action.kind == "malformed" else {"id": message_id})

    def _store_locked(self, key: str, body: dict[str, Any]) -> str | None:
        """The message id (stored now or replayed), or None: same key, different payload."""
        fingerprint = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        now = self._clock()
        record = self._records.get(key)
        if record is None or now - record.stored_at >= self.window_seconds:
            self._next_id += 1
            record = _Record(fingerprint, f"em_{self._next_id:06d}", now)
            self._records[key] = record
            self._stored.setdefault(key, []).append(body)
            return record.message_id
        if record.fingerprint != fingerprint:
            return None
        self._replays[key] += 1
        return record.message_id
