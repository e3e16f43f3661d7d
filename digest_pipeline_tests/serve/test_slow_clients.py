"""Slow, idle and surplus clients against the real server: each is cut off or refused in time.

Real sockets on loopback against `digest serve`'s uvicorn with short deadlines (one or two
seconds). A test asserts that the server closed the connection (an end of stream or a reset),
and at most a 408 or 503 before it, within a generous wait; never how fast it did so, so a
loaded machine cannot fail it. Nothing a cut-off request carried reaches the stores.
"""

import io
import json
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine

from digest_pipeline.cli import main
from digest_pipeline.rigs.servers.serve_process import ServeProcess
from digest_pipeline.settings import ServeLimits
from digest_pipeline_tests.builders import SHOP_LINK_SETTINGS
from digest_pipeline_tests.conftest import T0
from digest_pipeline_tests.fakes import FixedClock
from digest_pipeline_tests.serve.conftest import (
    SECRET,
    WEBHOOK_SECRET,
    Site,
    deliver_week,
    link,
    running,
    signed,
)

#: short deadlines, so a test waits seconds; the cap is out of the way
SHORT = ServeLimits(
    header_timeout=timedelta(seconds=1),
    body_timeout=timedelta(seconds=2),
    keep_alive=timedelta(seconds=1),
    max_connections=100,
)
#: a cap of three, with deadlines long enough that the connections holding it stay open
CAPPED = ServeLimits(
    header_timeout=timedelta(seconds=60),
    body_timeout=timedelta(seconds=60),
    keep_alive=timedelta(seconds=60),
    max_connections=3,
)
#: how long a test waits for the server to act on a deadline of a second or two
PATIENCE = 15.0


@dataclass
class Ending:
    """How a connection ended: closed by the server or not, and what the server wrote."""

    closed: bool
    received: bytes
    sent: int


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=PATIENCE)


def _until_closed(sock: socket.socket, trickle: bytes = b"", every: float = 0.5) -> Ending:
    """Sends `trickle` a byte every `every` seconds until the server closes, or `PATIENCE` ends."""
    received, sent = b"", 0
    sock.settimeout(every)
    give_up = time.monotonic() + PATIENCE
    while time.monotonic() < give_up:
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            if sent < len(trickle):
                try:
                    sock.sendall(trickle[sent : sent + 1])
                except (BrokenPipeError, ConnectionResetError):
                    return Ending(True, received, sent)
                sent += 1
            continue
        except ConnectionResetError:
            return Ending(True, received, sent)
        if not chunk:
            return Ending(True, received, sent)
        received += chunk
    return Ending(False, received, sent)


def _response(sock: socket.socket) -> bytes:
    """One whole response with a Content-Length, read off a keep-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(4096)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(4096)
    return head


def _page_request(customer: str = "customer-0001") -> bytes:
    """A GET of an unsubscribe link: a confirmation page, never an unsubscribe."""
    return f"GET {link(customer)} HTTP/1.1\r\nHost: feedback.test\r\n\r\n".encode()


def _cut_off(ending: Ending, status: bytes = b"408") -> bool:
    """Closed by the server, having written nothing or only the given refusal."""
    return ending.closed and (
        ending.received == b"" or ending.received.startswith(b"HTTP/1.1 " + status + b" ")
    )


def _site(engine: Engine, limits: ServeLimits) -> Iterator[Site]:
    """`digest serve` with `limits` over a delivered two-customer week."""
    clock = FixedClock(T0)
    mailer, _ = deliver_week(engine, clock, 2, unknown=())
    with running(engine, clock, mailer, limits) as site:
        yield site


@pytest.fixture
def short_site(sql_engine_factory: Callable[[str], Engine]) -> Iterator[Site]:
    yield from _site(sql_engine_factory("sqlite"), SHORT)


@pytest.fixture
def capped_site(sql_engine_factory: Callable[[str], Engine]) -> Iterator[Site]:
    yield from _site(sql_engine_factory("sqlite"), CAPPED)


def test_a_client_trickling_its_request_head_is_disconnected(short_site):
    with _connect(short_site.url) as sock:
        sock.sendall(f"POST {link('customer-0001')} HTTP/1.1\r\nHost: feedback.test\r\n".encode())
        ending = _until_closed(sock, trickle=b"X-Slow: " + b"a" * 1_000, every=0.2)

    assert _cut_off(ending), ending
    assert short_site.store.suppressions() == []


def test_a_connection_that_never_sends_a_request_is_disconnected(short_site):
    with _connect(short_site.url) as sock:
        ending = _until_closed(sock)

    assert _cut_off(ending), ending


def test_a_body_sent_a_byte_a_second_is_cut_off(short_site):
    # a signed, well-formed event that would be recorded, were it sent in time; each byte
    # comes well inside the body deadline, so only a bound on the whole body cuts it
    body = json.dumps({"type": "email.delivered", "pad": "x" * 200}).encode()
    headers = signed("msg_slow", body, short_site.clock.now())
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    with _connect(short_site.url) as sock:
        sock.sendall(
            f"POST /events/resend HTTP/1.1\r\nHost: feedback.test\r\n{head}"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
        )
        ending = _until_closed(sock, trickle=body, every=1.0)

    assert _cut_off(ending), ending
    assert ending.sent < len(body)
    assert short_site.store.provider_events() == []


def test_an_idle_keep_alive_connection_is_closed(short_site):
    with _connect(short_site.url) as sock:
        sock.sendall(_page_request())
        first = _response(sock)
        ending = _until_closed(sock)

    assert first.startswith(b"HTTP/1.1 200 ")
    assert ending.closed, ending
    assert ending.received == b""


def test_a_connection_answered_before_its_body_arrived_is_closed_once_idle(short_site):
    # an unknown provider is answered 404 without reading the body; the body comes after
    with _connect(short_site.url) as sock:
        sock.sendall(b"POST /events/nobody HTTP/1.1\r\nHost: feedback.test\r\n")
        sock.sendall(b"Content-Length: 10\r\n\r\n")
        answer = _response(sock)
        sock.sendall(b"0123456789")
        ending = _until_closed(sock)

    assert answer.startswith(b"HTTP/1.1 404 ")
    assert ending.closed, ending
    assert ending.received == b""


def test_connections_past_the_cap_are_refused_until_one_closes(capped_site):
    holders = [_connect(capped_site.url) for _ in range(3)]
    try:
        # each holder has had an answer, so the server counts all three before the fourth
        for sock in holders:
            sock.sendall(_page_request())
            assert _response(sock).startswith(b"HTTP/1.1 200 ")
        with _connect(capped_site.url) as surplus:
            surplus.sendall(_page_request())
            refused = _until_closed(surplus)
    finally:
        for sock in holders:
            sock.close()

    assert _cut_off(refused, b"503"), refused
    # the server hears of the holders' closes a moment later: a fresh client tries until then
    statuses = []
    give_up = time.monotonic() + PATIENCE
    while time.monotonic() < give_up and 200 not in statuses:
        try:
            with httpx.Client(base_url=capped_site.url, timeout=PATIENCE) as fresh:
                statuses.append(fresh.get(link("customer-0001")).status_code)
        except httpx.TransportError:
            statuses.append(0)
        time.sleep(0.1)
    assert statuses[-1] == 200, statuses
    assert set(statuses) <= {0, 200, 503}, statuses


def test_digest_serve_takes_its_cap_from_the_environment(
    sql_engine_factory: Callable[[str], Engine],
):
    engine = sql_engine_factory("sqlite")
    deliver_week(engine, FixedClock(T0), 2, unknown=())
    env = {
        "DIGEST_DATABASE_URL": engine.url.render_as_string(hide_password=False),
        "DIGEST_UNSUBSCRIBE_SECRET": SECRET,
        **SHOP_LINK_SETTINGS,
        "DIGEST_WEBHOOK_SECRETS": f"resend={WEBHOOK_SECRET}",
        "DIGEST_SERVE_MAX_CONNECTIONS": "1",
    }
    with ServeProcess(env) as server:
        with _connect(server.url) as holder, _connect(server.url) as surplus:
            holder.sendall(_page_request())
            answered = _response(holder)
            surplus.sendall(_page_request())
            refused = _until_closed(surplus)
        code, log = server.stopped()

    assert answered.startswith(b"HTTP/1.1 200 ")
    assert _cut_off(refused, b"503"), refused
    assert code == 0, log
    assert "event=connections_refused count=1 cap=1" in log


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("DIGEST_SERVE_HEADER_TIMEOUT_SECONDS", "soon", "a number of seconds from 0.1 to 3600"),
        ("DIGEST_SERVE_BODY_TIMEOUT_SECONDS", "0", "a number of seconds from 0.1 to 3600"),
        ("DIGEST_SERVE_MAX_CONNECTIONS", "0", "a whole number from 1 to 100000"),
    ],
)
def test_a_bad_limit_stops_digest_serve_with_one_line(tmp_path: Path, name, value, says):
    out, err = io.StringIO(), io.StringIO()

    code = main(["serve", "--port", "0"], env={name: value}, root=tmp_path, out=out, err=err)

    assert code == 2
    assert err.getvalue() == f"digest serve: error: {name}={value!r}: must be {says}\n"
