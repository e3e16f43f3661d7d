"""What the providers' loopback HTTP servers share: a server thread on a free port of 127.0.0.1.

Each provider's server makes its own `ThreadingHTTPServer` and handler; `LoopbackServer` runs it
on a thread and stops it, after `_wake` has released whatever its handlers may be waiting on.
"""

import socketserver
import threading
from http.server import ThreadingHTTPServer
from typing import Self


class LoopbackHttpd(ThreadingHTTPServer):
    """A threading HTTP server on 127.0.0.1 whose close joins its handler threads."""

    daemon_threads = True
    block_on_close = True

    def server_bind(self) -> None:
        # HTTPServer.server_bind does a reverse DNS lookup; loopback needs none
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "127.0.0.1", self.server_address[1]


class LoopbackServer:
    """Starts a provider's HTTP server on a thread, stops it, and says where it listens."""

    _httpd: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    def _new_httpd(self) -> ThreadingHTTPServer:
        raise NotImplementedError

    def _wake(self) -> None:
        """Releases what a handler may be blocked on before the server shuts down."""

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
