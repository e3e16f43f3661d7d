"""A real SMTP server on 127.0.0.1 for the mailer tests: aiosmtpd, scripted per recipient.

It records every message it stores and, per recipient, can answer any reply at RCPT or at the end
of DATA, hang after the body or drop the connection after the body. In the last two cases the
message *is* stored first, which is exactly the ambiguity the client must report as `unknown`.

Use the `smtp_peer` fixture (import `smtp_peer_fixture` into the test module), or
`with SmtpPeer(...) as peer:` for TLS, AUTH (whose login `revoke_login` then refuses) or several
peers.
"""

import asyncio
import email.policy
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from email.parser import BytesHeaderParser
from pathlib import Path
from typing import Any, Literal

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult

from digest_pipeline.rigs.servers.loopback import free_port as _free_port
from digest_pipeline.settings import SmtpSettings

#: reply texts with RFC 3463 enhanced codes; `{rcpt}` shows the address is echoed, as relays do
REPLY_TEXT = {
    421: "4.3.2 Service shutting down, closing transmission channel",
    450: "4.2.1 <{rcpt}>: Mailbox temporarily unavailable",
    451: "4.3.0 Local error in processing",
    452: "4.5.3 Too many recipients, slow down",
    454: "4.7.0 Temporary failure, rate limit exceeded",
    550: "5.1.1 <{rcpt}>: Recipient address rejected: User unknown",
    551: "5.1.6 <{rcpt}>: User not local",
    552: "5.3.4 Message size exceeds fixed limit",
    553: "5.1.3 <{rcpt}>: Mailbox name not allowed",
    554: "5.7.1 <{rcpt}>: Transaction failed",
}


@dataclass(frozen=True)
class Reply:
    """Answer `code` at RCPT or at the end of DATA (after the body), instead of 250."""

    code: int
    stage: Literal["rcpt", "data"] = "rcpt"

    def line(self, rcpt: str) -> str:
        return f"{self.code} {REPLY_TEXT.get(self.code, 'Scripted reply').format(rcpt=rcpt)}"


@dataclass(frozen=True)
class HangAfterBody:
    """Store the message, then stay silent for `seconds` (past the client timeout) and say 250."""

    seconds: float = 30.0


@dataclass(frozen=True)
class DropAfterBody:
    """Store the message, then close the connection without a final reply."""


Action = Reply | HangAfterBody | DropAfterBody


@dataclass(frozen=True)
class Received:
    """A message the peer stored: envelope and the bytes as transmitted (dot-unstuffed)."""

    mail_from: str
    rcpt_tos: tuple[str, ...]
    raw: bytes
    #: MAIL FROM's parameters, upper-cased by aiosmtpd: `("BODY=8BITMIME",)`
    mail_options: tuple[str, ...] = ()


def loopback_settings(port: int, **overrides: Any) -> SmtpSettings:
    """`SmtpSettings` for 127.0.0.1:`port`: plain SMTP, no login, 1 s timeout, unless overridden."""
    values: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": port,
        "username": None,
        "password": None,
        "security": "none",
        "timeout_seconds": 1.0,
    }
    return SmtpSettings(**(values | overrides))


class SmtpPeer:
    """The server's state and script; thread-safe (the handler runs in aiosmtpd's loop thread)."""

    host = "127.0.0.1"

    def __init__(
        self,
        *,
        tls: ssl.SSLContext | None = None,
        implicit_tls: bool = False,
        credentials: tuple[str, str] | None = None,
        eight_bit: bool = True,
    ) -> None:
        """`eight_bit=False`: EHLO does not offer 8BITMIME (aiosmtpd's `decode_data`)."""
        self.port = _free_port()
        self._lock = threading.Lock()
        self._messages: list[Received] = []
        self._scripts: dict[str, list[Any]] = {}
        self._servers: list[SMTP] = []
        self._credentials = credentials
        self._revoked = False
        kwargs: dict[str, Any] = {
            "server_hostname": "peer.test",
            "ready_timeout": 5.0,
            "decode_data": not eight_bit,
        }
        if tls is not None and implicit_tls:
            kwargs["ssl_context"] = tls
        elif tls is not None:
            kwargs.update(tls_context=tls, require_starttls=True)
        if credentials is not None:
            kwargs.update(authenticator=self._authenticate, auth_require_tls=tls is not None)
        self._controller = _CountingController(self, _Handler(self), self.host, self.port, **kwargs)

    # -- what tests use ---------------------------------------------------------------------
    def script(self, recipient: str, action: Action, *, times: int | None = None) -> None:
        """From now on answer `recipient` with `action` (the next `times` transactions only)."""
        with self._lock:
            self._scripts[recipient.lower()] = [action, times]

    def revoke_login(self) -> None:
        """From now on refuse every login (535 5.7.8), as a relay does once its password changed.

        Only a peer made with `credentials` offers AUTH; sessions already logged in stay so.
        """
        with self._lock:
            self._revoked = True

    @property
    def messages(self) -> list[Received]:
        with self._lock:
            return list(self._messages)

    @property
    def connections(self) -> int:
        """Client connections accepted since start."""
        with self._lock:
            return len(self._servers)

    def delivered_count(self, operation_key: str) -> int:
        """Stored messages whose `X-Digest-Operation-Key` header is `operation_key`."""
        parser = BytesHeaderParser(policy=email.policy.default)
        keys = [parser.parsebytes(m.raw)["X-Digest-Operation-Key"] for m in self.messages]
        return keys.count(operation_key)

    def settings(self, **overrides: Any) -> SmtpSettings:
        """Settings that reach this peer: plain SMTP, no login, 1 s timeout, unless overridden."""
        return loopback_settings(self.port, **overrides)

    # -- lifecycle --------------------------------------------------------------------------
    def __enter__(self) -> "SmtpPeer":
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        self._controller.start()
        with self._lock:
            self._servers.clear()  # the controller's own readiness probe is not a client

    def stop(self) -> None:
        loop = self._controller.loop
        asyncio.run_coroutine_threadsafe(self._quiesce(), loop).result(timeout=10)
        self._controller.stop()

    async def _quiesce(self) -> None:
        """Closes every session and waits for its task, so stopping leaves nothing unclosed."""
        with self._lock:
            servers = list(self._servers)
        for server in servers:
            if isinstance(server.transport, asyncio.Transport):
                server.transport.abort()  # close() would wait for an idle TLS client's close_notify
        me = asyncio.current_task()
        for _ in range(500):
            if all(t is me or t.done() for t in asyncio.all_tasks()):
                return
            await asyncio.sleep(0.01)

    # -- used by the handler ----------------------------------------------------------------
    def _opened(self, server: SMTP) -> None:
        with self._lock:
            self._servers.append(server)

    def _take(self, recipients: list[str], stage: str) -> Action | None:
        with self._lock:
            for rcpt in recipients:
                entry = self._scripts.get(rcpt.lower())
                if entry is None:
                    continue
                action, times = entry
                at = action.stage if isinstance(action, Reply) else "data"
                if at != stage or times == 0:
                    continue
                if times is not None:
                    entry[1] = times - 1
                return action  # type: ignore[no-any-return]
        return None

    def _store(self, received: Received) -> None:
        with self._lock:
            self._messages.append(received)

    def _authenticate(
        self, server: SMTP, session: Any, envelope: Any, mechanism: str, data: Any
    ) -> AuthResult:
        login = getattr(data, "login", b"").decode("utf-8", "replace")
        password = getattr(data, "password", b"").decode("utf-8", "replace")
        with self._lock:
            ok = (login, password) == self._credentials and not self._revoked
        return AuthResult(success=ok, handled=False, auth_data=data if ok else None)


class _Handler:
    def __init__(self, peer: SmtpPeer) -> None:
        self._peer = peer

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options) -> str:
        action = self._peer._take([address], "rcpt")
        if isinstance(action, Reply):
            return action.line(address)
        envelope.rcpt_tos.append(address)
        return "250 2.1.5 OK"

    async def handle_DATA(self, server, session, envelope) -> str:
        action = self._peer._take(envelope.rcpt_tos, "data")
        if isinstance(action, Reply):
            return action.line(envelope.rcpt_tos[0])
        raw = envelope.original_content or b""
        options = tuple(envelope.mail_options)
        received = Received(envelope.mail_from, tuple(envelope.rcpt_tos), bytes(raw), options)
        self._peer._store(received)
        if isinstance(action, DropAfterBody):
            server.transport.abort()  # connection_lost cancels this task during the sleep
            await asyncio.sleep(3600)
        if isinstance(action, HangAfterBody):
            await asyncio.sleep(action.seconds)  # the client's EOF cancels it sooner
        return "250 2.0.0 OK: queued"


class _CountingController(Controller):
    def __init__(self, peer: SmtpPeer, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._peer = peer

    def factory(self) -> SMTP:
        server: SMTP = super().factory()  # type: ignore[no-untyped-call]
        self._peer._opened(server)
        return server


@pytest.fixture(name="smtp_peer")
def smtp_peer_fixture() -> Iterator[SmtpPeer]:
    """A plain-SMTP peer on 127.0.0.1 that answers 250 unless scripted."""
    with SmtpPeer() as peer:
        yield peer


def self_signed_tls(directory: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A (server, client) context pair for 127.0.0.1 from a throwaway `openssl` certificate.

    Skips the calling test when the `openssl` command is not installed.
    """
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command is needed to make a throwaway certificate")
    key, cert = directory / "key.pem", directory / "cert.pem"
    subprocess.run(
        [
            *(openssl, "req", "-x509", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1"),
            *("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"),
            *("-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    return server, ssl.create_default_context(cafile=str(cert))
