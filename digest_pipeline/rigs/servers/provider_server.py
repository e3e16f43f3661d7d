"""A real HTTP server on 127.0.0.1 speaking the provider's `POST /emails` API, for tests and rigs.

It honours idempotency keys as Resend does (same key and payload: the same id and nothing stored
again; same key, other payload: 409; a key still in flight: 409), forgets keys after a window,
and can be scripted per key to fail, throttle, hang or drop the connection after storing. Like
Resend, it can also tell a webhook endpoint what became of a message: `send_webhook` POSTs a
Svix-signed `email.delivered` / `email.bounced` / `email.complained` event (`webhook_payload`).
"""

import contextlib
import hashlib
import itertools
import json
import socket
import socketserver
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

import httpx

from digest_pipeline.domain.webhooks import parse_secret, signature


@dataclass(frozen=True)
class Action:
    """What the server does with one request of a key; build one with the functions below."""

    kind: str
    status: int = 200
    name: str | None = None
    retry_after: str | None = None
    #: the response's `Date` header instead of the real time (to test HTTP-date Retry-After)
    date: str | None = None
    seconds: float = 0.0


def ok() -> Action:
    """Accept (the default once a key's script runs out): 200 `{"id": ...}`."""
    return Action("ok")


def status(
    code: int,
    name: str | None = None,
    retry_after: int | str | None = None,
    date: str | None = None,
) -> Action:
    """Answer `code` with a JSON error body and nothing stored."""
    return Action("status", code, name, None if retry_after is None else str(retry_after), date)


def quota() -> Action:
    """Answer 429 `daily_quota_exceeded`: the account's quota is spent."""
    return status(429, "daily_quota_exceeded")


def conflict_concurrent() -> Action:
    """Answer 409 `concurrent_idempotent_requests`, as for a key still in flight."""
    return status(409, "concurrent_idempotent_requests")


def store_then_hang(seconds: float = 5.0) -> Action:
    """Store the message as accepted, then answer only after `seconds` (or at shutdown)."""
    return Action("hang", seconds=seconds)


def store_then_drop() -> Action:
    """Store the message as accepted, then close the connection without a response."""
    return Action("drop")


def malformed_success() -> Action:
    """Store the message, then answer 200 with a body that has no `id`."""
    return Action("malformed")


def hold() -> Action:
    """Keep the key in flight until `release(key)` (or shutdown), then accept."""
    return Action("hold")


@dataclass(frozen=True)
class Received:
    """One request as the server read it (headers include Authorization: tests only)."""

    path: str
    headers: dict[str, str]
    body: Any


@dataclass(frozen=True)
class _Record:
    fingerprint: str
    message_id: str
    stored_at: float


def webhook_payload(
    event_type: str,
    *,
    key: object | None = None,
    message_id: str | None = None,
    bounce_type: str | None = None,
) -> dict[str, Any]:
    """A Resend-style event body: `type`, and `data` with the message id and our key's tag.

    `event_type` is Resend's (`email.delivered`, `email.bounced`, `email.complained`, …);
    `bounce_type` (`Permanent`, `Transient`) goes in `data.bounce.type` as Resend puts it.
    """
    data: dict[str, Any] = {"created_at": "2026-10-19T06:00:00.000Z"}
    if message_id is not None:
        data["email_id"] = message_id
    if key is not None:
        # the tag the HTTP mailer set, spelled as Resend tags allow (`:` replaced)
        data["tags"] = {"operation_key": str(key).replace(":", "_")}
    if bounce_type is not None:
        data["bounce"] = {"type": bounce_type, "subType": "General", "message": "bounced"}
    return {"type": event_type, "created_at": data["created_at"], "data": data}


def signed_headers(secret: str, event_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The Svix headers of one webhook request, signed with `secret` (`whsec_…` or plain)."""
    return {
        "webhook-id": event_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(parse_secret(secret), event_id, timestamp, body),
        "content-type": "application/json",
    }


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_Httpd"
    date_override: str | None = None

    def setup(self) -> None:
        super().setup()
        # headers and body go out as separate writes: without this, Nagle and delayed ACKs
        # add ~40 ms to every keep-alive response
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.provider._opened(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.provider._closed(self.connection)

    def do_POST(self) -> None:
        self.server.provider._handle(self)

    def date_time_string(self, timestamp: float | None = None) -> str:
        return self.date_override or super().date_time_string(timestamp)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean


class _Httpd(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = True  # server_close() joins the handler threads

    def __init__(self, provider: "ProviderServer") -> None:
        self.provider = provider
        super().__init__(("127.0.0.1", 0), _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind does a reverse DNS lookup; loopback needs none
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "127.0.0.1", self.server_address[1]

    def handle_error(self, request: Any, client_address: Any) -> None:
        self.provider._handler_failed()


def _reply(
    h: _Handler, code: int, body: dict[str, Any], headers: dict[str, str] | None = None
) -> None:
    data = json.dumps(body).encode()
    h.send_response(code)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(data)))
    for name, value in (headers or {}).items():
        h.send_header(name, value)
    h.end_headers()
    h.wfile.write(data)


def _error(h: _Handler, code: int, name: str, action: Action | None = None) -> None:
    headers = {}
    if action is not None and action.retry_after is not None:
        headers["Retry-After"] = action.retry_after
    h.date_override = action.date if action is not None else None
    _reply(h, code, {"statusCode": code, "name": name, "message": name.replace("_", " ")}, headers)


class ProviderServer:
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
    ) -> None:
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
        self._lock = threading.Lock()
        self._in_flight_changed = threading.Condition(self._lock)
        self._scripts: dict[str, list[Action]] = {}
        self._records: dict[str, _Record] = {}
        self._stored: dict[str, list[dict[str, Any]]] = {}
        self._replays: Counter[str] = Counter()
        self._in_flight: set[str] = set()
        self._holds: dict[str, threading.Event] = {}
        self._received: list[Received] = []
        self._connections: set[socket.socket] = set()
        self._connections_opened = 0
        self._handler_errors = 0
        self._next_id = 0
        self._stopping = threading.Event()
        self._httpd: _Httpd | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "ProviderServer":
        self._httpd = _Httpd(self)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            for event in self._holds.values():
                event.set()
            connections = list(self._connections)
        for conn in connections:  # wakes handlers blocked on idle keep-alive connections
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._httpd is not None:
            try:
                self._httpd.shutdown()
            finally:
                self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> "ProviderServer":
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._httpd is not None, "the server is not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    # -- arranging ---------------------------------------------------------------------------
    def script(self, key: object, *actions: Action) -> None:
        """Queues actions for the next requests of `key` (one each); then requests are `ok`."""
        with self._lock:
            self._scripts.setdefault(str(key), []).extend(actions)

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
    def requests(self) -> int:
        with self._lock:
            return len(self._received)

    @property
    def received(self) -> list[Received]:
        with self._lock:
            return list(self._received)

    @property
    def connections_opened(self) -> int:
        with self._lock:
            return self._connections_opened

    @property
    def handler_errors(self) -> int:
        """Handler exceptions other than the client going away (a server bug if not 0)."""
        with self._lock:
            return self._handler_errors

    # -- the handler's side ------------------------------------------------------------------
    def _opened(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections.add(conn)
            self._connections_opened += 1

    def _closed(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections.discard(conn)

    def _handler_failed(self) -> None:
        with self._lock:
            self._handler_errors += 0 if self._stopping.is_set() else 1

    def _handle(self, h: _Handler) -> None:
        raw = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        key = h.headers.get("Idempotency-Key", "")
        with self._lock:
            self._received.append(Received(h.path, dict(h.headers.items()), body))
        if self.latency_seconds:
            time.sleep(self.latency_seconds)
        if h.path != "/emails":
            _error(h, 404, "not_found")
            return
        auth = h.headers.get("Authorization")
        if auth != f"Bearer {self.api_key}":
            _error(h, 401, "missing_api_key" if auth is None else "invalid_api_key")
            return
        if not key:
            _error(h, 400, "missing_idempotency_key")
            return
        if not isinstance(body, dict) or not all(f in body for f in ("from", "to", "subject")):
            _error(h, 422, "validation_error")
            return
        with self._lock:
            if key in self._in_flight:
                action: Action | None = None
            else:
                queue = self._scripts.get(key)
                action = queue.pop(0) if queue else self.fallback
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

    def _accept(self, h: _Handler, key: str, body: dict[str, Any], action: Action) -> None:
        try:
            if action.kind == "hold":
                with self._lock:
                    event = self._holds.setdefault(key, threading.Event())
                event.wait(timeout=30)
            with self._lock:
                message_id = self._store_locked(key, body)
        finally:
            with self._lock:
                self._in_flight.discard(key)
        if message_id is None:
            _error(h, 409, "invalid_idempotent_request")
            return
        if action.kind == "hang":
            self._stopping.wait(action.seconds)
        elif action.kind == "drop":
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
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
