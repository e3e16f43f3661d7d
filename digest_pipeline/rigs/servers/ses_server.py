"""Amazon SES v2 for real over HTTP on loopback: moto's server mode behind a scriptable fault proxy.

`MotoSes` runs moto's `ThreadedMotoServer` on a free port of 127.0.0.1; `SesServer` resets it,
verifies the sender identities and puts `SesFaultProxy` in front of it, and a mailer is pointed
at the proxy (`url`). Moto answers `SendEmail` as SES does (a `MessageId`, or `MessageRejected`
for an unverified sender) and holds what it accepted (`messages`); it keeps its state per
process, so one `SesServer` runs at a time.

The proxy forwards each request unchanged, records it (`received`: one entry per HTTP request),
and reads the operation key from the request's `EmailTags` to apply a script queued with
provider_actions.py's vocabulary, read the SES way: `status(code, name)` answers `code` with SES
v2's REST-JSON error (`x-amzn-ErrorType: <name>` and `{"message": …}`; no name: an empty body) and
forwards nothing (`quota()`: 429 `TooManyRequestsException`, "Daily message quota exceeded.");
`store_then_drop()` forwards to moto, then closes the connection unanswered; `store_then_hang(s)`
forwards, then answers only after `s` seconds (past the client's timeout); `malformed_success()`
forwards, then answers 200 `{}` (no `MessageId`).
"""

import contextlib
import email
import http.client
import json
import os
import uuid
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import urlsplit

import boto3
import httpx
from botocore.config import Config
from moto.core.models import DEFAULT_ACCOUNT_ID
from moto.server import ThreadedMotoServer
from moto.ses.models import ses_backends

from digest_pipeline.domain.errors import InvalidOperationKey
from digest_pipeline.domain.ses_tags import TAG_NAME, key_of_tag
from digest_pipeline.rigs.servers.loopback import (
    LoopbackHandler,
    LoopbackHttpd,
    LoopbackServer,
    Received,
)
from digest_pipeline.rigs.servers.provider_actions import Action, ok

REGION = "eu-west-1"
#: the environment that keeps a developer's own AWS set-up (config and credential files, the
#: instance metadata service) out of every boto3 client a test or rig makes
HERMETIC_AWS = {
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}
#: fake credentials: moto checks no signature, and nothing else ever sees them
ACCESS_KEY_ID, SECRET_ACCESS_KEY = "AKIATESTINGSES000001", "ses-test-secret/9b1de4f2a7c3"
#: the hop-by-hop headers a proxy does not pass on (RFC 9110 §7.6.1)
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "upgrade"})
#: SES's free text can quote an address; the tests check that no detail ever echoes it
_MESSAGE = "Email address is not verified: customer@mailbox.example ({name})"
#: provider_actions' provider-neutral names, as SES says them: (error code, message)
_SES_NAMES = {
    "daily_quota_exceeded": ("TooManyRequestsException", "Daily message quota exceeded."),
}


@dataclass(frozen=True)
class SentMessage:
    """One message moto accepted: its id, the envelope and the raw bytes as SES received them."""

    message_id: str
    source: str
    destinations: tuple[str, ...]
    raw: bytes

    @property
    def operation_key(self) -> str | None:
        """The `X-Digest-Operation-Key` header of the raw message."""
        return email.message_from_bytes(self.raw).get("X-Digest-Operation-Key")


@dataclass(frozen=True)
class _Answer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes


class _Handler(LoopbackHandler):
    def do_POST(self) -> None:
        owner = self.server.owner
        assert isinstance(owner, SesFaultProxy)
        owner._handle(self)


class SesFaultProxy(LoopbackServer):
    """A loopback HTTP proxy to moto that answers scripted keys with SES's faults instead."""

    def __init__(self, upstream: str) -> None:
        super().__init__()
        self._upstream = urlsplit(upstream)

    def _new_httpd(self) -> LoopbackHttpd:
        return LoopbackHttpd(self, _Handler)

    @property
    def received(self) -> list[Received]:
        with self._lock:
            return list(self._received)

    # -- the handler's side ------------------------------------------------------------------
    def _handle(self, h: _Handler) -> None:
        raw, body = self._read(h)
        with self._lock:
            action = self._scripted(_key_of(body), ok())
        if action.kind == "status":
            _error(h, action)
            return
        answer = self._forward(h, raw)
        # moto holds the message: a dropped answer leaves the client with a closed connection
        if self._hold_or_drop(h, action):
            return
        if action.kind == "malformed":
            answer = _Answer(200, [("Content-Type", "application/json")], b"{}")
        with contextlib.suppress(OSError):  # a client that gave up has closed its end
            _reply(h, answer)

    def _forward(self, h: _Handler, raw: bytes) -> _Answer:
        conn = http.client.HTTPConnection(
            self._upstream.hostname or "127.0.0.1", self._upstream.port, timeout=30
        )
        try:
            headers = {n: v for n, v in h.headers.items() if n.lower() not in _HOP_BY_HOP}
            conn.request(h.command, h.path, body=raw, headers=headers)
            response = conn.getresponse()
            return _Answer(response.status, response.getheaders(), response.read())
        finally:
            conn.close()


def _key_of(body: Any) -> str:
    """The operation key a `SendEmail` body's tag carries, or "" for none."""
    tags = body.get("EmailTags") if isinstance(body, dict) else None
    for tag in tags if isinstance(tags, list) else []:
        if isinstance(tag, dict) and tag.get("Name") == TAG_NAME:
            with contextlib.suppress(InvalidOperationKey):
                return str(key_of_tag(tag.get("Value")))
    return ""


def _reply(h: _Handler, answer: _Answer) -> None:
    h.send_response(answer.status)
    for name, value in answer.headers:
        if name.lower() not in _HOP_BY_HOP | {"content-length"}:
            h.send_header(name, value)
    h.send_header("Content-Length", str(len(answer.body)))
    h.end_headers()
    h.wfile.write(answer.body)


def _error(h: _Handler, action: Action) -> None:
    """SES v2's REST-JSON error: the code in `x-amzn-ErrorType`, the text in `message`."""
    headers = [("x-amzn-RequestId", str(uuid.uuid4()))]
    body = b""
    if action.name is not None:
        code, text = _SES_NAMES.get(action.name, (action.name, _MESSAGE.format(name=action.name)))
        headers.append(
            ("x-amzn-ErrorType", f"{code}:http://internal.amazon.com/coral/com.amazon.ses/")
        )
        headers.append(("Content-Type", "application/json"))
        body = json.dumps({"message": text}).encode()
    if action.retry_after is not None:
        headers.append(("Retry-After", action.retry_after))
    _reply(h, _Answer(action.status, headers, body))


class MotoSes:
    """Moto's server on a free loopback port: SES v2 with the rig's account and fake credentials.

    Moto keeps its state per process, so one runs at a time; `reset` empties every backend.
    """

    def __init__(self) -> None:
        self.access_key_id, self.secret_access_key = ACCESS_KEY_ID, SECRET_ACCESS_KEY
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> Self:
        self._server.start()
        self.reset()
        return self

    def stop(self) -> None:
        self._server.stop()

    @property
    def url(self) -> str:
        host, port = self._server.get_host_and_port()
        return f"http://{host}:{port}"

    def reset(self) -> None:
        httpx.post(f"{self.url}/moto-api/reset", timeout=10).raise_for_status()

    def client(self, region: str, endpoint_url: str | None = None) -> Any:
        """A boto3 `sesv2` client of the rig's account (moto's own URL unless told otherwise)."""
        return boto3.session.Session(
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            region_name=region,
        ).client(
            "sesv2",
            endpoint_url=endpoint_url or self.url,
            config=Config(retries={"total_max_attempts": 1}, ignore_configured_endpoint_urls=True),
        )

    def verify(self, region: str, identities: tuple[str, ...]) -> None:
        """Makes `identities` (addresses or domains) verified senders in `region`."""
        client = self.client(region)
        try:
            for identity in identities:
                client.create_email_identity(EmailIdentity=identity)
        finally:
            client.close()

    def messages(self, region: str) -> list[SentMessage]:
        """What moto accepted in `region`, oldest first (its backend lives in this process)."""
        backend = ses_backends[DEFAULT_ACCOUNT_ID][region]
        return [
            SentMessage(m.id, m.source, tuple(m.destinations), m.raw_data.encode("utf-8"))
            for m in list(backend.sent_messages)
        ]


class SesServer:
    """Moto's SES v2 behind `SesFaultProxy`, from a reset moto; use it as a context manager.

    Given a running `MotoSes`, it shares it (moto starts in about half a second); otherwise it
    starts and stops its own.
    """

    def __init__(
        self,
        moto: MotoSes | None = None,
        *,
        verified: tuple[str, ...] = ("digest@example.com",),
        region: str = REGION,
    ) -> None:
        self.region = region
        self.verified = verified
        self._own = moto is None
        self.moto = moto if moto is not None else MotoSes()
        self.access_key_id = self.moto.access_key_id
        self.secret_access_key = self.moto.secret_access_key
        self._proxy: SesFaultProxy | None = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> Self:
        if self._own:
            self.moto.start()
        else:
            self.moto.reset()
        self.moto.verify(self.region, self.verified)
        self._proxy = SesFaultProxy(self.moto.url).start()
        return self

    def stop(self) -> None:
        try:
            if self._proxy is not None:
                self._proxy.stop()
            self.moto.reset()
        finally:
            if self._own:
                self.moto.stop()

    @property
    def proxy(self) -> SesFaultProxy:
        assert self._proxy is not None, "the server is not started"
        return self._proxy

    @property
    def url(self) -> str:
        """Where a mailer sends: the fault proxy."""
        return self.proxy.url

    def script(self, key: object, *actions: Action) -> None:
        self.proxy.script(key, *actions)

    @property
    def received(self) -> list[Received]:
        """Every HTTP request that reached the proxy, in order."""
        return self.proxy.received

    @property
    def requests(self) -> int:
        return self.proxy.requests

    @property
    def handler_errors(self) -> int:
        return self.proxy.handler_errors

    def messages(self) -> list[SentMessage]:
        """What moto accepted in the rig's region, oldest first."""
        return self.moto.messages(self.region)

    def delivered_count(self, key: object) -> int:
        return sum(1 for m in self.messages() if m.operation_key == str(key))

    def message_id(self, key: object) -> str | None:
        """The `MessageId` moto gave the key's first accepted message."""
        ids = [m.message_id for m in self.messages() if m.operation_key == str(key)]
        return ids[0] if ids else None
