"""uvicorn's httptools protocol with deadlines on every connection and a cap on connections.

uvicorn times only the idle spell after a response: a client that opens a connection and
trickles a request head, or a body a byte at a time, is held forever. Here every phase of a
connection has one deadline (`ServeLimits`), and a connection past the cap is refused at once.
"""

# The defaults (settings.py) close a slow client within seconds: 10 s for a head and 10 s for
# a body (the largest, a 256 KiB webhook, needs 26 KB/s), 512 connections (below Linux's
# default 1,024 open files). The keep-alive wait is 10 s. A server
# that closes an idle connection races a client reusing it at that instant (the request is
# lost in flight), so the wait should outlast the client's own idle limit: 10 s outlasts the
# common pools (httpx 5 s, Node's undici 4 s), and the README's proxy opens a connection per
# request. Outlasting a pooling proxy too (nginx's upstream `keepalive_timeout`, 60 s) would let
# finished clients hold the cap's slots for over a minute; such a proxy is set to idle its
# connections for less than `DIGEST_SERVE_KEEP_ALIVE_SECONDS`, or the setting is raised.

import asyncio
import enum
import time
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from digest_pipeline.services.logs import step_log
from digest_pipeline.settings import ServeLimits

#: seconds a refused connection stays open to take in the request it may already be sending:
#: closing a socket with unread bytes sends a reset, which can destroy the 503 before the
#: client reads it
REFUSAL_LINGER_SECONDS = 1.0
#: seconds between two `connections_refused` log lines while the cap holds
REFUSAL_LOG_INTERVAL_SECONDS = 10.0


class _Phase(enum.Enum):
    """What a connection's deadline waits for."""

    #: the end of a request head
    HEAD = "head"
    #: the end of a request body
    BODY = "body"
    #: the next request on an idle keep-alive connection
    IDLE = "idle"


def _closing_response(status: int, reason: bytes, extra: bytes = b"") -> bytes:
    return b"".join(
        [
            STATUS_LINE[status],
            b"content-type: text/plain; charset=utf-8\r\n",
            b"content-length: %d\r\n" % len(reason),
            b"connection: close\r\n",
            extra,
            b"\r\n",
            reason,
        ]
    )


#: RFC 9110 §15.5.9: a request not received in time, with `close`, since the server will not wait
_TIMED_OUT = _closing_response(408, b"Request Timeout")
#: RFC 9110 §15.6.4, with a retry hint for the provider and the proxy
_REFUSED = _closing_response(503, b"Service Unavailable", b"retry-after: 1\r\n")


class _RefusalLog:
    """One log line per `REFUSAL_LOG_INTERVAL_SECONDS` for a server's refused connections."""

    def __init__(self) -> None:
        self._refused = 0
        self._logged_at: float | None = None

    def refused(self, cap: int) -> None:
        """Counts a refusal; logs the count since the last line, unless that was too recent."""
        self._refused += 1
        now = time.monotonic()
        if self._logged_at is None or now - self._logged_at >= REFUSAL_LOG_INTERVAL_SECONDS:
            step_log.warning("connections_refused", count=self._refused, cap=cap)
            self._refused, self._logged_at = 0, now


class GuardedProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol` with one deadline per phase of a connection, and a connection cap.

    The phases: the request head (from the opening, or from the first byte after an idle
    spell), the body (from the end of the head to the end of the message, in total), and the
    idle keep-alive spell after a response, which replaces uvicorn's own timer. While the
    application works on a request there is no deadline: the client has sent everything.
    """

    limits = ServeLimits()
    _refusals = _RefusalLog()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase: _Phase | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._refusing = False

    def _arm(self, phase: _Phase) -> None:
        wait = {
            _Phase.HEAD: self.limits.header_timeout,
            _Phase.BODY: self.limits.body_timeout,
            _Phase.IDLE: self.limits.keep_alive,
        }[phase]
        self._disarm()
        self._phase = phase
        self._deadline = self.loop.call_later(wait.total_seconds(), self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._phase, self._deadline = None, None

    def _expired(self) -> None:
        phase = self._phase
        self._phase, self._deadline = None, None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if phase is _Phase.HEAD and cycle is not None and not cycle.response_complete:
            # a pipelined head is late while the request before it is answered: that answer
            # is finished, then the connection closes (as uvicorn's graceful shutdown does)
            cycle.keep_alive = False
            return
        answered = cycle is not None and cycle.response_started
        if phase is _Phase.HEAD or (phase is _Phase.BODY and not answered and not self.pipeline):
            # nothing else is being written on the connection: the client may read why
            self.transport.write(_TIMED_OUT)
        self.transport.close()

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.limits.max_connections:
            self._refuse(transport)
            return
        super().connection_made(transport)
        self._arm(_Phase.HEAD)

    def _refuse(self, transport: asyncio.Transport) -> None:
        """Answers 503 and closes, without counting the connection or reading its request."""
        self._refusing = True
        self.transport = transport
        self._refusals.refused(self.limits.max_connections)
        transport.write(_REFUSED)
        if transport.can_write_eof():
            # the 503 and a FIN now; the request is read and dropped until the client closes
            transport.write_eof()
            self._deadline = self.loop.call_later(REFUSAL_LINGER_SECONDS, transport.close)
        else:
            transport.close()

    def data_received(self, data: bytes) -> None:
        if self._refusing:
            return
        if self._phase is _Phase.IDLE:
            # the next request has begun (or bytes that are not one): its head is now timed
            self._arm(_Phase.HEAD)
        super().data_received(data)

    def eof_received(self) -> None:
        # returning None closes the transport: a refused client has read the 503 and left
        if not self._refusing:
            super().eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._refusing:
            return
        super().connection_lost(exc)

    # httptools parser callbacks

    def on_message_begin(self) -> None:
        if self._phase is not _Phase.HEAD:
            # a request pipelined behind another; any other head is timed already, from the
            # opening or from its first byte after an idle spell
            self._arm(_Phase.HEAD)
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._arm(_Phase.BODY)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        cycle = self.cycle
        if cycle is not None and cycle.response_complete and not self.transport.is_closing():
            # answered before its body was all in (a 404 reads no body): idle from here on
            self._arm(_Phase.IDLE)
        else:
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.timeout_keep_alive_task is not None:
            # uvicorn armed its keep-alive timer (the connection stays open, nothing is queued):
            # the IDLE deadline replaces it, so a connection's deadlines are timed in one place.
            # A head or body still arriving keeps its own deadline.
            self._unset_keepalive_if_required()
            if self._phase is None:
                self._arm(_Phase.IDLE)


def guarded_protocol(limits: ServeLimits) -> type[GuardedProtocol]:
    """A `GuardedProtocol` class for one server, enforcing `limits`.

    uvicorn makes a protocol per connection from a class, so the limits and the refusal log
    are class attributes of a class made per server.
    """
    server_limits = limits

    class ServerGuardedProtocol(GuardedProtocol):
        limits = server_limits
        _refusals = _RefusalLog()

    return ServerGuardedProtocol
