"""A real HTTP server on 127.0.0.1 speaking SendGrid's `POST /v3/mail/send`, for tests and rigs.

Like SendGrid it keeps no idempotency key: every accepted request is a message, stored under the
`custom_args.operation_key` it carries (`stored`, `delivered_count`), and answered 202 with an
empty body and an `X-Message-Id` header. It refuses what SendGrid's v3 reference refuses, with
SendGrid's error body `{"errors": [{"message": …, "field": …, "help": …}]}`: a wrong or missing
API key (401), a body without personalizations, from, subject or content, `text/html` before
`text/plain`, or a reserved header in `headers` (400), and any other path (404).

It is scripted per operation key with provider_actions.py's vocabulary, read the SendGrid way:
`status(code, field)` answers `code` with `field` as `errors[0].field` and stores nothing
(`status(429, retry_after=30)` sets `X-RateLimit-Reset` 30 s ahead); `store_then_hang(s)` stores
the message, then answers only after `s` seconds (past the client's timeout); `store_then_drop`
stores it and closes the connection; `malformed_success` stores it and answers 202 without
`X-Message-Id`.

Like SendGrid's Signed Event Webhook it can tell an endpoint what became of a message:
`send_event` POSTs a batch of one event about a key's first message, signed with the server's
own ECDSA P-256 key, whose public half `event_verification_key` gives as SendGrid's Mail
Settings show it.
"""

import base64
import itertools
import json
import time
from typing import Any

import httpx
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from digest_pipeline.rigs.servers.loopback import (
    LoopbackHandler,
    LoopbackHttpd,
    LoopbackServer,
    Received,
)
from digest_pipeline.rigs.servers.provider_actions import Action, ok

SEND_PATH = "/v3/mail/send"
#: what SendGrid refuses in `headers` (case-insensitive)
RESERVED = frozenset(
    {
        "x-sg-id",
        "x-sg-eid",
        "received",
        "dkim-signature",
        "content-type",
        "content-transfer-encoding",
        "to",
        "from",
        "subject",
        "reply-to",
        "cc",
        "bcc",
    }
)
_MESSAGES = {
    400: "Bad Request",
    401: "The provided authorization grant is invalid, expired, or revoked",
    403: "The from address does not match a verified Sender Identity.",
    404: "Not Found",
    413: "The JSON payload you have included in your request is too large.",
    429: "too many requests",
    500: "internal error",
}
_HELP = "https://docs.sendgrid.com/api-reference/mail-send/errors"
#: the Signed Event Webhook's headers, spelled as SendGrid sends them (spelled out here rather
#: than taken from the webhook adapter, so a wrong name there is caught, not copied)
EVENT_SIGNATURE_HEADER = "X-Twilio-Email-Event-Webhook-Signature"
EVENT_TIMESTAMP_HEADER = "X-Twilio-Email-Event-Webhook-Timestamp"
#: what SendGrid appends to a message's `X-Message-Id` in its events' `sg_message_id`
_EVENT_ID_SUFFIX = ".filterdrecv-5bd4b9c8-1-6543A1B2-3.0"


class _Handler(LoopbackHandler):
    def do_POST(self) -> None:
        owner = self.server.owner
        assert isinstance(owner, SendGridServer)
        owner._handle(self)


class _Httpd(LoopbackHttpd):
    request_queue_size = 64


def _reply(h: _Handler, code: int, body: bytes, headers: dict[str, str]) -> None:
    h.send_response(code)
    h.send_header("Content-Length", str(len(body)))
    for name, value in headers.items():
        h.send_header(name, value)
    h.end_headers()
    h.wfile.write(body)


def _error(
    h: _Handler, code: int, field: str | None = None, headers: dict[str, str] | None = None
) -> None:
    error = {"message": _MESSAGES.get(code, "error"), "field": field, "help": _HELP}
    body = json.dumps({"errors": [error]}).encode()
    _reply(h, code, body, {"Content-Type": "application/json", **(headers or {})})


def invalid_field(body: Any) -> str | None:
    """The field SendGrid would name in a 400 for this body, or None when it is well formed."""
    if not isinstance(body, dict):
        return None if body is not None else "body"
    to = body.get("personalizations")
    if not (isinstance(to, list) and to and isinstance(to[0], dict) and to[0].get("to")):
        return "personalizations"
    sender = body.get("from")
    if not (isinstance(sender, dict) and sender.get("email")):
        return "from.email"
    if not body.get("subject"):
        return "subject"
    content = body.get("content")
    kinds = (
        [c.get("type") for c in content if isinstance(c, dict)] if isinstance(content, list) else []
    )
    if not kinds or kinds[0] != "text/plain" or len(set(kinds)) != len(kinds):
        return "content"
    headers = body.get("headers", {})
    if not isinstance(headers, dict) or any(n.lower() in RESERVED for n in headers):
        return "headers"
    args = body.get("custom_args", {})
    if not isinstance(args, dict) or not all(isinstance(v, str) for v in args.values()):
        return "custom_args"
    return None


class SendGridServer(LoopbackServer):
    """SendGrid's mail-send API on a free loopback port; use it as a context manager."""

    def __init__(
        self, *, api_key: str = "SG.test_9b1d.e4f2a7c3", fallback: Action | None = None
    ) -> None:
        self.api_key = api_key
        #: what a request of a key with no script left gets (`ok()` unless given)
        self.fallback = fallback or ok()
        super().__init__()
        self._stored: dict[str, list[dict[str, Any]]] = {}
        self._message_ids: dict[str, list[str]] = {}
        self._next_id = 0
        #: the Event Webhook's signing key, made on first use (a key pair per server)
        self._event_key: ec.EllipticCurvePrivateKey | None = None
        self._event_ids = itertools.count(1)

    # -- lifecycle ---------------------------------------------------------------------------
    def _new_httpd(self) -> "_Httpd":
        return _Httpd(self, _Handler)

    # -- arranging and inspecting ------------------------------------------------------------
    @property
    def stored(self) -> dict[str, list[dict[str, Any]]]:
        """The accepted messages per operation key: every accepted request is one more."""
        with self._lock:
            return {k: list(v) for k, v in self._stored.items()}

    def delivered_count(self, key: object) -> int:
        with self._lock:
            return len(self._stored.get(str(key), []))

    def message_id(self, key: object) -> str | None:
        """The `X-Message-Id` of the key's first accepted message."""
        with self._lock:
            ids = self._message_ids.get(str(key))
            return ids[0] if ids else None

    @property
    def received(self) -> list[Received]:
        with self._lock:
            return list(self._received)

    # -- the Signed Event Webhook ------------------------------------------------------------
    def event_verification_key(self) -> str:
        """The base64 DER public key of the event signatures (SendGrid's Mail Settings show it)."""
        public = self._signing_key().public_key()
        der = public.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
        return base64.b64encode(der).decode()

    def send_event(
        self, url: str, event: str, key: object, *, timestamp: int, event_id: str | None = None
    ) -> httpx.Response:
        """POSTs a signed batch of one `event` (`delivered`, `bounce`, …) about `key`'s message.

        As SendGrid's Event Webhook does: the message's `custom_args` are echoed at the top level,
        `sg_message_id` is its `X-Message-Id` with a filter suffix, and the signature is ECDSA
        P-256 over the timestamp's text followed by the body. `timestamp` is the signing time in
        Unix seconds (the endpoint's clock decides whether it is fresh).
        """
        with self._lock:
            ids = self._message_ids.get(str(key))
            stored = self._stored.get(str(key))
        if not ids or not stored:
            raise ValueError(f"no message of {key} was accepted")
        entry: dict[str, Any] = {
            "email": stored[0]["personalizations"][0]["to"][0]["email"],
            "timestamp": timestamp,
            "event": event,
            "sg_event_id": event_id or f"sgev{next(self._event_ids):012d}",
            "sg_message_id": ids[0] + _EVENT_ID_SUFFIX,
            **stored[0].get("custom_args", {}),
        }
        body = json.dumps([entry]).encode()
        stamp = str(timestamp)
        signature = self._signing_key().sign(stamp.encode() + body, ec.ECDSA(hashes.SHA256()))
        headers = {
            "Content-Type": "application/json",
            EVENT_TIMESTAMP_HEADER: stamp,
            EVENT_SIGNATURE_HEADER: base64.b64encode(signature).decode(),
        }
        return httpx.post(url, content=body, headers=headers, timeout=10.0)

    def _signing_key(self) -> ec.EllipticCurvePrivateKey:
        with self._lock:
            if self._event_key is None:
                self._event_key = ec.generate_private_key(ec.SECP256R1())
            return self._event_key

    # -- the handler's side ------------------------------------------------------------------
    def _handle(self, h: _Handler) -> None:
        _, body = self._read(h)
        if h.path != SEND_PATH:
            _error(h, 404)
            return
        if h.headers.get("Authorization") != f"Bearer {self.api_key}":
            _error(h, 401)
            return
        field = invalid_field(body)
        if field is not None:
            _error(h, 400, field)
            return
        key = str(body.get("custom_args", {}).get("operation_key", ""))
        with self._lock:
            action = self._scripted(key, self.fallback)
        if action.kind == "status":
            headers = {}
            if action.status == 429 and action.retry_after is not None:
                reset = int(time.time()) + int(action.retry_after)
                headers = {"X-RateLimit-Limit": "600", "X-RateLimit-Remaining": "0"}
                headers["X-RateLimit-Reset"] = str(reset)
            _error(h, action.status, action.name, headers)
            return
        self._accept(h, key, body, action)

    def _accept(self, h: _Handler, key: str, body: dict[str, Any], action: Action) -> None:
        with self._lock:
            self._next_id += 1
            message_id = f"sg{self._next_id:06d}AbCdEf"
            self._stored.setdefault(key, []).append(body)
            self._message_ids.setdefault(key, []).append(message_id)
        if self._hold_or_drop(h, action):
            return
        headers = {} if action.kind == "malformed" else {"X-Message-Id": message_id}
        _reply(h, 202, b"", headers)
