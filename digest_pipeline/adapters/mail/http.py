"""The HTTP provider mailer: Resend-style `POST /emails` with `Idempotency-Key: <operation key>`.

Every reply and transport error comes back as a classified `SendOutcome` (table below), never as
an exception, so a retry or a reconciliation resend reuses the key the provider deduplicates on.
"""

# | the provider / the transport says                         | class     | detail                    |
# |-----------------------------------------------------------|-----------|---------------------------|
# | 2xx with an `id`                                          | sent      | accepted                  |
# | 2xx without an `id` (it accepted *something*)             | unknown   | http:200:malformed_body   |
# | 429 daily_quota_exceeded / monthly_quota_exceeded         | throttled | http:429:<name>, quota    |
# | 429 otherwise (Retry-After: seconds or HTTP-date)         | throttled | http:429[:<name>]         |
# | 409 invalid_idempotent_request (same key, other payload)  | permanent | logged at ERROR: a bug    |
# | 409 concurrent_idempotent_requests                        | transient | http:409:<name>           |
# | 408 (the provider gave up reading the request)            | transient | http:408                  |
# | 5xx                                                       | transient | http:<status>[:<name>]    |
# | any other 3xx (redirects are not followed) or 4xx         | permanent | http:<status>[:<name>]    |
# | ConnectError, ConnectTimeout, PoolTimeout: never left     | transient | http:connect_error, ...   |
# | ProxyError, UnsupportedProtocol, InvalidURL: never left   | transient | http:invalid_url, ...     |
# | ReadTimeout, WriteTimeout, ReadError, RemoteProtocolError | unknown   | http:read_timeout, ...    |
# |   and any other httpx error (it may have been sent)       |           |                           |

import logging
import re
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from functools import partial
from typing import Any

import httpx

from digest_pipeline.adapters.mail.mime import check_message
from digest_pipeline.domain.errors import RenderError
from digest_pipeline.domain.failures import FailureClass, SendOutcome, render_failure_code
from digest_pipeline.domain.mailer_identity import fingerprint, mailer_identity
from digest_pipeline.domain.model import MailerCapabilities, Message
from digest_pipeline.ports import Mailer
from digest_pipeline.settings import ProviderSettings

logger = logging.getLogger("digest_pipeline.adapters.http")

_QUOTA_NAMES = frozenset({"daily_quota_exceeded", "monthly_quota_exceeded"})
_NEVER_LEFT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.ProxyError)
#: a URL the client cannot use: nothing left either
_MISCONFIGURED = (httpx.UnsupportedProtocol, httpx.InvalidURL)
#: the only error names echoed into a detail: the provider's codes, never free text
_ERROR_NAME = re.compile(r"[a-z0-9_]{1,64}")
#: Resend tags allow ASCII letters, digits, `_` and `-`
_TAG_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_DELTA_SECONDS = re.compile(r"[0-9]{1,10}")
#: a larger Retry-After is read as this: a wild date must not push the schedule out of range
_MAX_RETRY_AFTER = timedelta(days=1)
#: the provider stamps its own Date; one that changed per attempt would turn an idempotent
#: resend into a 409 `invalid_idempotent_request`
_PROVIDER_HEADERS = frozenset({"date"})


def _event(event: str, level: int = logging.INFO, **fields: object) -> None:
    """The services' `event=<name> key=<operation key> k=v` format; no address, no API key."""
    if logger.isEnabledFor(level):
        parts = " ".join(f"{k}={v}" for k, v in fields.items() if v is not None)
        logger.log(level, "event=%s %s", event, parts)


class HttpProviderMailer(Mailer):
    """Sends through the provider's API over one pooled, thread-safe `httpx.Client`.

    The client is created on the first send, not in the constructor; `close()` releases it (a
    later send opens a new one). A `transport` given here is owned by the mailer from then on.
    """

    def __init__(
        self, settings: ProviderSettings, *, transport: httpx.BaseTransport | None = None
    ) -> None:
        self._settings = settings
        self._transport = transport
        self._lock = threading.Lock()
        self._client: httpx.Client | None = None

    @property
    def capabilities(self) -> MailerCapabilities:
        return MailerCapabilities(
            idempotency_window=self._settings.idempotency_window, can_lookup=False
        )

    @property
    def identity(self) -> str:
        # the account is the key's: another key may be another account, whose lookups and
        # deduplication know nothing of this one's sends
        key = fingerprint(self._settings.api_key)
        return mailer_identity("http", self._settings.url, key)

    def recipe(self) -> Callable[[], Mailer] | None:
        # a transport handed in (a test's stand-in provider) stays in this process
        return None if self._transport is not None else partial(HttpProviderMailer, self._settings)

    def send(self, message: Message, *, idempotency_key: str) -> SendOutcome:
        key = str(message.key)
        if idempotency_key != key:
            _event("idempotency_key_mismatch", logging.ERROR, key=key)
            return SendOutcome.failed(FailureClass.PERMANENT, "http:idempotency_key_mismatch")
        try:
            # The header rules every mailer applies. No full serialisation: the provider builds
            # the MIME message from the JSON fields and validates the addresses itself (a 422).
            check_message(message)
        except RenderError as e:
            return SendOutcome.failed(FailureClass.PERMANENT, render_failure_code(e))
        try:
            response = self._http().post(
                "/emails", json=_body(message), headers={"Idempotency-Key": key}
            )
        except (httpx.HTTPError, httpx.InvalidURL) as e:
            outcome = _transport_outcome(e)
        else:
            outcome = _response_outcome(response, key)
        level = logging.WARNING if outcome.failure_class is FailureClass.UNKNOWN else logging.DEBUG
        _event("provider_send", level, key=key, outcome=outcome.label, detail=outcome.detail)
        return outcome

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def __enter__(self) -> "HttpProviderMailer":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def prepare(self) -> None:
        # the client's TLS context takes tens of milliseconds to build; no connection is opened
        self._http()

    def _http(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                self._client = httpx.Client(
                    base_url=self._settings.url,
                    headers={"Authorization": f"Bearer {self._settings.api_key}"},
                    timeout=httpx.Timeout(self._settings.timeout_seconds),
                    transport=self._transport,
                    follow_redirects=False,
                )
            return self._client


def _body(message: Message) -> dict[str, Any]:
    body: dict[str, Any] = {
        "from": message.sender,
        "to": [message.recipient],
        "subject": message.subject,
        "text": message.text,
        "headers": {n: v for n, v in message.headers if n.lower() not in _PROVIDER_HEADERS},
        "tags": [
            {"name": "operation_key", "value": _TAG_UNSAFE.sub("_", str(message.key))},
            {"name": "period", "value": str(message.key.period)},
        ],
    }
    if message.html is not None:
        body["html"] = message.html
    return body


def _transport_outcome(error: httpx.HTTPError | httpx.InvalidURL) -> SendOutcome:
    code = re.sub(r"(?<!^)(?=[A-Z])", "_", type(error).__name__).lower()
    # A request that never left cannot have been accepted; after that, anything may have been.
    failure = (
        FailureClass.TRANSIENT
        if isinstance(error, _NEVER_LEFT + _MISCONFIGURED)
        else FailureClass.UNKNOWN
    )
    return SendOutcome.failed(failure, f"http:{code}")


def _response_outcome(response: httpx.Response, key: str) -> SendOutcome:
    status = response.status_code
    if response.is_success:
        provider_id = _json_field(response, "id")
        if provider_id is None:
            return SendOutcome.failed(FailureClass.UNKNOWN, f"http:{status}:malformed_body")
        return SendOutcome.sent(provider_id)
    name = _json_field(response, "name")
    name = name if name is not None and _ERROR_NAME.fullmatch(name) else None
    detail = f"http:{status}" + (f":{name}" if name else "")
    if status == 429:
        return SendOutcome.failed(
            FailureClass.THROTTLED,
            detail,
            retry_after=_retry_after(response),
            quota=name in _QUOTA_NAMES,
        )
    if status == 409 and name == "invalid_idempotent_request":
        _event("idempotency_key_payload_mismatch", logging.ERROR, key=key, detail=detail)
        return SendOutcome.failed(FailureClass.PERMANENT, detail)
    if (status == 409 and name == "concurrent_idempotent_requests") or status == 408:
        return SendOutcome.failed(FailureClass.TRANSIENT, detail)
    return SendOutcome.failed(
        FailureClass.TRANSIENT if status >= 500 else FailureClass.PERMANENT, detail
    )


def _json_field(response: httpx.Response, field: str) -> str | None:
    try:
        body = response.json()
    except ValueError:  # JSON and UTF-8 decoding errors are both ValueErrors
        return None
    value = body.get(field) if isinstance(body, dict) else None
    return value if isinstance(value, str) and value else None


def _retry_after(response: httpx.Response) -> timedelta | None:
    """`Retry-After` as delta-seconds or an HTTP-date relative to `Date` (RFC 9110 §10.2.3)."""
    raw = response.headers.get("Retry-After", "").strip()
    if _DELTA_SECONDS.fullmatch(raw):
        return min(timedelta(seconds=int(raw)), _MAX_RETRY_AFTER)
    at = _http_date(raw)
    if at is None:
        return None
    answered = _http_date(response.headers.get("Date", "")) or datetime.now(UTC)
    return min(max(at - answered, timedelta(0)), _MAX_RETRY_AFTER)


def _http_date(raw: str) -> datetime | None:
    if not raw:
        return None
    try:
        parsed = parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    # HTTP-dates are GMT; `-0000` parses as naive
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
