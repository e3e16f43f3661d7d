"""What the provider mailers share: one lazily built, closable client, and the HTTP ones' settings.

Each provider's mailer adds its request, its answers' failure classes and its credential header
(`_auth_headers`); the client never follows a redirect, so a send goes where it was configured
to go or nowhere.
"""

import threading
from typing import Any, Self

import httpx

from digest_pipeline.ports import Mailer
from digest_pipeline.settings import ProviderSettings


class ClientMailer(Mailer):
    """A mailer over one client built on first use under `_lock`; `close()` releases it.

    A later send builds a new client, so a closed mailer still sends.
    """

    _client: Any

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._client = None

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class ProviderClientMailer(ClientMailer):
    """A mailer over one provider's HTTP API (`DIGEST_PROVIDER_*`)."""

    _client: httpx.Client | None

    def __init__(
        self, settings: ProviderSettings, *, transport: httpx.BaseTransport | None = None
    ) -> None:
        super().__init__()
        self._settings = settings
        self._transport = transport

    def _auth_headers(self) -> dict[str, str]:
        """The headers every request carries: the provider's credential, and its content types."""
        return {"Authorization": f"Bearer {self._settings.api_key}"}

    def prepare(self) -> None:
        # the client's TLS context takes tens of milliseconds to build; no connection is opened
        self._http()

    def _http(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                self._client = httpx.Client(
                    base_url=self._settings.url,
                    headers=self._auth_headers(),
                    timeout=httpx.Timeout(self._settings.timeout_seconds),
                    transport=self._transport,
                    follow_redirects=False,
                )
            return self._client
