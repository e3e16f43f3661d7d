"""SES over TLS: a request that never left is retried, one whose answer broke is never resent.

botocore reports every TLS failure as one `SSLError`, whether the handshake refused the server's
certificate (nothing was sent) or the stream broke while the answer was read (SES may have
accepted the message). Both are made here by a real TLS peer on loopback: one whose certificate
the client does not trust, and one that reads the whole request and then writes bytes that are
not a TLS record where its answer should be.
"""

import os
import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from digest_pipeline.adapters.mail.ses import SesMailer
from digest_pipeline.domain.failures import FailureClass
from digest_pipeline.ses_settings import SesSettings
from digest_pipeline_tests.aws_env import isolate_aws
from digest_pipeline_tests.integration.provider_messages import message, send
from digest_pipeline_tests.sns_signing import loopback_ca_pem, loopback_server_context


@pytest.fixture(autouse=True)
def aws_isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No developer's AWS files or variables; returns where the test CA's bundle is written."""
    isolate_aws(monkeypatch)
    bundle = tmp_path / "test-ca.pem"
    bundle.write_bytes(loopback_ca_pem())
    return bundle


class BrokenAnswerPeer:
    """A TLS server that reads one whole request, then answers with bytes that are not TLS."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._context = loopback_server_context()
        self._lock = threading.Lock()
        self._requests: list[bytes] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def requests(self) -> list[bytes]:
        with self._lock:
            return list(self._requests)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            with conn:
                try:
                    self._answer(conn)
                except (OSError, ssl.SSLError):
                    continue  # a client that gave up: nothing to record

    def _answer(self, conn: socket.socket) -> None:
        with self._context.wrap_socket(conn, server_side=True) as tls:
            self._read_and_break(tls)

    def _read_and_break(self, tls: ssl.SSLSocket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = tls.recv(65536)
            if not chunk:
                return
            head += chunk
        headers, _, body = head.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in headers.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(body) < length:
            body += tls.recv(65536)
        with self._lock:
            self._requests.append(body)
        # the request arrived whole; what comes back is not a TLS record
        os.write(tls.fileno(), b"HTTP/1.1 200 OK\r\n\r\nnot a TLS record at all" * 4)

    @contextmanager
    def running(self) -> Iterator["BrokenAnswerPeer"]:
        self._thread.start()
        try:
            yield self
        finally:
            self._listener.close()
            self._thread.join(timeout=10)


def mailer_for(port: int) -> SesMailer:
    return SesMailer(
        SesSettings(
            region="eu-west-1",
            endpoint_url=f"https://127.0.0.1:{port}",
            configuration_set=None,
            timeout_seconds=2.0,
            access_key_id="AKIATESTTLS000000001",
            secret_access_key="a-secret-for-the-tls-tests",
        )
    )


def test_an_answer_broken_after_the_request_arrived_is_unknown(aws_isolated, monkeypatch):
    monkeypatch.setenv("AWS_CA_BUNDLE", str(aws_isolated))
    with BrokenAnswerPeer().running() as peer, mailer_for(peer.port) as mailer:
        outcome = send(mailer, message())
    # the peer read the whole request: SES may have taken it, so it must never be resent
    assert len(peer.requests) == 1
    assert outcome.failure_class is FailureClass.UNKNOWN, outcome.detail


def test_a_certificate_the_client_refuses_is_transient_and_nothing_arrived(aws_isolated):
    # the default trust store does not know the test CA: the handshake fails before the request
    with BrokenAnswerPeer().running() as peer, mailer_for(peer.port) as mailer:
        outcome = send(mailer, message())
    assert peer.requests == []
    assert outcome.failure_class is FailureClass.TRANSIENT, outcome.detail
