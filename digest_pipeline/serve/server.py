"""uvicorn as `digest serve` runs it, in the foreground for the command or on a thread for tests.

Both use `uvicorn_config`, so a test exercises the server the command starts, with the same
deadlines and connection cap (serve/guard.py). The access log is off: its request lines would
carry every unsubscribe token (a credential) into the log; the application logs its own
`event=…` lines instead, with customer ids and codes only.
"""

import socket
import threading
from types import TracebackType

import uvicorn
from starlette.applications import Starlette

from digest_pipeline.serve.guard import guarded_protocol
from digest_pipeline.settings import ServeLimits

#: seconds a shutdown waits for requests in flight before it closes their connections
GRACEFUL_SHUTDOWN_SECONDS = 10


def uvicorn_config(
    app: Starlette, host: str, port: int, limits: ServeLimits | None = None
) -> uvicorn.Config:
    """The server's settings: no access log, no `Server` header, no logging config of its own.

    Every connection runs under `limits` (the defaults when None): the guarded protocol times
    the request head, the body and the idle keep-alive spell, and refuses connections past the
    cap. Forwarded headers from a proxy on loopback are honoured (uvicorn's default), which
    matters only for the client address: no page or response depends on the scheme or host it
    was reached by.
    """
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        access_log=False,
        log_config=None,
        log_level="warning",
        server_header=False,
        lifespan="off",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
        http=guarded_protocol(limits or ServeLimits()),
        # no route is a WebSocket: an upgrade request stays an HTTP request, under the deadlines
        ws="none",
    )


def listening_socket(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A TCP socket bound to (host, port) and listening; OSError (port taken, bad host) as is.

    Bound here rather than by uvicorn, so a port in use is one clear error before anything
    starts, and port 0 (any free port) can be read back with `getsockname()`.
    """
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock


def serve_forever(app: Starlette, sock: socket.socket, limits: ServeLimits | None = None) -> None:
    """Serves on `sock` until SIGINT or SIGTERM, finishing the requests in flight first.

    uvicorn re-raises the signal once it has shut down: SIGINT as KeyboardInterrupt here.
    """
    host, port = sock.getsockname()[:2]
    uvicorn.Server(uvicorn_config(app, host, port, limits)).run(sockets=[sock])


class BackgroundServer:
    """The application under uvicorn on a free loopback port, on a thread; a context manager.

    The socket is bound and listening before the thread starts, so a client may connect at once
    (the kernel queues it until uvicorn accepts): no waiting for the server to come up.
    """

    def __init__(
        self, app: Starlette, host: str = "127.0.0.1", limits: ServeLimits | None = None
    ) -> None:
        self._sock = listening_socket(host, 0)
        self._host, self._port = self._sock.getsockname()[:2]
        # off the main thread uvicorn installs no signal handlers: `should_exit` stops it
        self._server = uvicorn.Server(uvicorn_config(app, self._host, self._port, limits))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self._port}"

    def __enter__(self) -> "BackgroundServer":
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=GRACEFUL_SHUTDOWN_SECONDS + 5)
        self._sock.close()
