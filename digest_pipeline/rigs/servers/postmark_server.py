"""A real HTTP server on 127.0.0.1 speaking Postmark's send and message-search API, for tests.

`POST /email` answers as Postmark does: 200 `{"ErrorCode": 0, "MessageID": ...}`, 401 with
`ErrorCode` 10 for a wrong server token, 422 with `ErrorCode` 300 for an invalid request and 406
for an inactive recipient. Like Postmark it has no idempotency key: every accepted request is a
new message. `GET /messages/outbound` searches the accepted messages by `metadata_<field>` and
`messagestream`. Each operation key (its `Metadata.operation_key`) can be scripted with
provider_actions.py's vocabulary (`status` with the ErrorCode as its name, `store_then_hang`,
`store_then_drop`, `malformed_success`) or `hang_unaccepted` (answer late, store nothing);
`script_search` scripts the search's answers. `send_webhook` POSTs a Postmark webhook event,
authenticated with HTTP basic auth as Postmark's are.
"""

import base64
import itertools
import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

from digest_pipeline.rigs.servers.loopback import (
    LoopbackHandler,
    LoopbackHttpd,
    LoopbackServer,
    Received,
)
from digest_pipeline.rigs.servers.provider_actions import Action, ok

TOKEN = "pm-server-token-7d1e0c4b9a"
_REQUIRED = ("From", "To", "Subject")


def error(status: int, error_code: int) -> Action:
    """Answer `status` with Postmark's `{"ErrorCode": error_code, "Message": ...}`, store nothing."""
    return Action("status", status, str(error_code))


def hang_unaccepted(seconds: float = 5.0) -> Action:
    """Answer only after `seconds` (or at shutdown) with a 500, having stored nothing."""
    return Action("hang_unaccepted", seconds=seconds)


@dataclass(frozen=True)
class Accepted:
    """One message Postmark took: its id, stream, Metadata and the request body."""

    message_id: str
    stream: str
    metadata: dict[str, str]
    body: dict[str, Any]


class _Handler(LoopbackHandler):
    def do_POST(self) -> None:
        self._owner()._handle(self, "POST")

    def do_GET(self) -> None:
        self._owner()._handle(self, "GET")

    def _owner(self) -> "PostmarkServer":
        owner = self.server.owner
        assert isinstance(owner, PostmarkServer)
        return owner


_MESSAGES = {
    10: "The Server Token you provided in the X-Postmark-Server-Token request header was invalid.",
    300: "Invalid email request.",
    406: "You tried to send to a recipient that has been marked as inactive.",
}


def _reply(h: _Handler, status: int, body: dict[str, Any], headers: dict[str, str]) -> None:
    data = json.dumps(body).encode()
    h.send_response(status)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(data)))
    for name, value in headers.items():
        h.send_header(name, value)
    h.end_headers()
    h.wfile.write(data)


def _error(h: _Handler, status: int, code: int, retry_after: str | None = None) -> None:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    message = _MESSAGES.get(code, "Error.")
    _reply(h, status, {"ErrorCode": code, "Message": message}, headers)


class PostmarkServer(LoopbackServer):
    """Postmark on a free loopback port; use it as a context manager."""

    def __init__(self, *, token: str = TOKEN, inactive: frozenset[str] = frozenset()) -> None:
        self.token = token
        #: recipients Postmark refuses with 406 (bounced, complained, unsubscribed)
        self.inactive = inactive
        super().__init__()
        self._search_script: list[Action] = []
        self._accepted: list[Accepted] = []
        self._ids = itertools.count(1)

    # -- lifecycle ---------------------------------------------------------------------------
    def _new_httpd(self) -> LoopbackHttpd:
        return LoopbackHttpd(self, _Handler)

    # -- arranging and inspecting ------------------------------------------------------------
    def script_search(self, *actions: Action) -> None:
        """Queues answers for the next searches (`status`/`error` or `hang_unaccepted`)."""
        with self._lock:
            self._search_script.extend(actions)

    def messages_for(self, key: object) -> list[Accepted]:
        """The accepted messages whose `Metadata.operation_key` is `key`."""
        with self._lock:
            return [a for a in self._accepted if a.metadata.get("operation_key") == str(key)]

    @property
    def accepted(self) -> list[Accepted]:
        with self._lock:
            return list(self._accepted)

    @property
    def received(self) -> list[Received]:
        with self._lock:
            return list(self._received)

    def send_webhook(
        self, url: str, event: dict[str, Any], *, credentials: str | None
    ) -> httpx.Response:
        """POSTs a webhook `event` to `url` with basic auth `user:password`, as Postmark does."""
        headers = {"Content-Type": "application/json"}
        if credentials is not None:
            token = base64.b64encode(credentials.encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        return httpx.post(url, content=json.dumps(event).encode(), headers=headers, timeout=10.0)

    # -- the handler's side ------------------------------------------------------------------
    def _handle(self, h: _Handler, method: str) -> None:
        _, body = self._read(h, method)
        path = urlsplit(h.path)
        if h.headers.get("X-Postmark-Server-Token") != self.token:
            _error(h, 401, 10)
        elif method == "POST" and path.path == "/email":
            self._send(h, body)
        elif method == "GET" and path.path == "/messages/outbound":
            self._search(h, parse_qs(path.query))
        else:
            _reply(h, 404, {"ErrorCode": 404, "Message": "Not found."}, {})

    def _send(self, h: _Handler, body: Any) -> None:
        if (
            not isinstance(body, dict)
            or not all(isinstance(body.get(f), str) and body[f] for f in _REQUIRED)
            or not (body.get("TextBody") or body.get("HtmlBody"))
        ):
            _error(h, 422, 300)
            return
        if body["To"] in self.inactive:
            _error(h, 422, 406)
            return
        given = body.get("Metadata")
        metadata: dict[str, Any] = given if isinstance(given, dict) else {}
        key = str(metadata.get("operation_key", ""))
        with self._lock:
            action = self._scripted(key, ok())
        if action.kind == "status":
            _error(h, action.status, int(action.name or 0), action.retry_after)
            return
        if action.kind == "hang_unaccepted":
            self._stopping.wait(action.seconds)
            _error(h, 500, 0)
            return
        message_id = str(uuid.UUID(int=next(self._ids)))
        with self._lock:
            stream = str(body.get("MessageStream") or "outbound")
            self._accepted.append(Accepted(message_id, stream, dict(metadata), body))
        if self._hold_or_drop(h, action):
            return
        answer: dict[str, Any] = {
            "To": body["To"],
            "SubmittedAt": datetime.now(UTC).isoformat(),
            "MessageID": message_id,
            "ErrorCode": 0,
            "Message": "OK",
        }
        if action.kind == "malformed":
            answer = {"Message": "OK"}
        _reply(h, 200, answer, {})

    def _search(self, h: _Handler, query: dict[str, list[str]]) -> None:
        with self._lock:
            action = self._search_script.pop(0) if self._search_script else ok()
        if action.kind == "status":
            _error(h, action.status, int(action.name or 0), action.retry_after)
            return
        if action.kind == "hang_unaccepted":
            self._stopping.wait(action.seconds)
        try:
            count, offset = int(query["count"][0]), int(query["offset"][0])
        except (KeyError, ValueError):
            _error(h, 422, 300)
            return
        wanted = {
            name.removeprefix("metadata_"): values[0]
            for name, values in query.items()
            if name.startswith("metadata_")
        }
        stream = query.get("messagestream", [None])[0]

        def matches(a: Accepted) -> bool:
            held = all(a.metadata.get(f) == v for f, v in wanted.items())
            return held and (stream is None or a.stream == stream)

        with self._lock:
            found = [a for a in reversed(self._accepted) if matches(a)]
        page = [
            {"MessageID": a.message_id, "MessageStream": a.stream, "Metadata": a.metadata}
            for a in found[offset : offset + count]
        ]
        _reply(h, 200, {"TotalCount": len(found), "Messages": page}, {})
