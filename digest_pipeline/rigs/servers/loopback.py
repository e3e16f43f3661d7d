"""What the providers' loopback HTTP servers share: a server thread on a free port of 127.0.0.1.

Each provider's server answers requests its own way (`_handle`); `LoopbackServer` runs its HTTP
server on a thread, reads and records each request, keeps each key's script of actions
(provider_actions.py), hangs or drops a stored message's answer, keeps track of the open
connections and of handler failures, and stops it after `_wake` has released what its handlers
may wait on.
"""

import contextlib
import json
import socket
import socketserver
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

from digest_pipeline.rigs.servers.provider_actions import Action


def free_port() -> int:
    """A loopback TCP port nothing listens on now: a connection to it is refused at once.

    The port is bound and released, so another process may take it later.
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True)
class Received:
    """One request as a server read it (headers include the credential: tests only)."""

    path: str
    headers: dict[str, str]
    body: Any
    method: str = "POST"


class LoopbackHandler(BaseHTTPRequestHandler):
    """A keep-alive handler that tells its server each connection it opens and closes."""

    protocol_version = "HTTP/1.1"
    server: "LoopbackHttpd"

    def setup(self) -> None:
        super().setup()
        # headers and body go out as separate writes: without this, Nagle and delayed ACKs
        # add ~40 ms to every keep-alive response
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.owner._opened(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.owner._closed(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean


class LoopbackHttpd(ThreadingHTTPServer):
    """A threading HTTP server on 127.0.0.1 whose close joins its handler threads."""

    daemon_threads = True
    block_on_close = True

    def __init__(self, owner: "LoopbackServer", handler: type[LoopbackHandler]) -> None:
        self.owner = owner
        super().__init__(("127.0.0.1", 0), handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind does a reverse DNS lookup; loopback needs none
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "127.0.0.1", self.server_address[1]

    def handle_error(self, request: Any, client_address: Any) -> None:
        self.owner._handler_failed()


class LoopbackServer:
    """Starts a provider's HTTP server on a thread, stops it, and says where it listens."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._received: list[Received] = []
        self._scripts: dict[str, list[Action]] = {}
        self._connections: set[socket.socket] = set()
        self._connections_opened = 0
        self._handler_errors = 0
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def _new_httpd(self) -> ThreadingHTTPServer:
        raise NotImplementedError

    def _wake(self) -> None:
        """Releases what a handler may be blocked on before the server shuts down."""
        self._stopping.set()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:  # wakes handlers blocked on idle keep-alive connections
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def start(self) -> Self:
        self._httpd = self._new_httpd()
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._wake()
        if self._httpd is not None:
            try:
                self._httpd.shutdown()
            finally:
                self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._httpd is not None, "the server is not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    @property
    def requests(self) -> int:
        with self._lock:
            return len(self._received)

    @property
    def connections_opened(self) -> int:
        with self._lock:
            return self._connections_opened

    @property
    def handler_errors(self) -> int:
        """Handler exceptions other than the client going away (a server bug if not 0)."""
        with self._lock:
            return self._handler_errors

    def script(self, key: object, *actions: Action) -> None:
        """Queues actions for the next requests of `key` (one each); then the server's default."""
        with self._lock:
            self._scripts.setdefault(str(key), []).extend(actions)

    # -- the handler's side ------------------------------------------------------------------
    def _read(self, h: BaseHTTPRequestHandler, method: str = "POST") -> tuple[bytes, Any]:
        """The request's bytes and JSON body (None when it is not JSON), recorded as read."""
        raw = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        with self._lock:
            self._received.append(Received(h.path, dict(h.headers.items()), body, method))
        return raw, body

    def _scripted(self, key: str, fallback: Action) -> Action:
        """The next action queued for `key`, else `fallback`; the caller holds `_lock`."""
        queue = self._scripts.get(key)
        return queue.pop(0) if queue else fallback

    def _hold_or_drop(self, h: BaseHTTPRequestHandler, action: Action) -> bool:
        """After a message is stored: `hang` waits past the client's timeout; `drop` closes.

        True after a drop: the connection is shut, and nothing more may be written.
        """
        if action.kind == "hang":
            self._stopping.wait(action.seconds)
        elif action.kind == "drop":
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
            return True
        return False

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
