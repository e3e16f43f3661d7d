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
from collections.abc import Callable
from functools import partial
from typing import Any

import httpx

from digest_pipeline.adapters.mail.http_common import (
    PROVIDER_HEADERS,
    json_field,
    log_event,
    retry_after,
    transport_outcome,
)
from digest_pipeline.adapters.mail.mime import check_message
from digest_pipeline.adapters.mail.provider_client import ProviderClientMailer
from digest_pipeline.domain.errors import RenderError
from digest_pipeline.domain.failures import FailureClass, SendOutcome, render_failure_code
from digest_pipeline.domain.mailer_identity import fingerprint, mailer_identity
from digest_pipeline.domain.model import MailerCapabilities, Message
from digest_pipeline.ports import Mailer

logger = logging.getLogger("digest_pipeline.adapters.http")

_QUOTA_NAMES = frozenset({"daily_quota_exceeded", "monthly_quota_exceeded"})
#: the only error names echoed into a detail: the provider's codes, never free text
_ERROR_NAME = re.compile(r"[a-z0-9_]{1,64}")
#: Resend tags allow ASCII letters, digits, `_` and `-`
_TAG_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def _event(event: str, level: int = logging.INFO, **fields: object) -> None:
    log_event(logger, event, level, **fields)


class HttpProviderMailer(ProviderClientMailer):
    """Sends through the provider's API over one pooled, thread-safe `httpx.Client`.

    The client is created on the first send, not in the constructor; `close()` releases it (a
    later send opens a new one). A `transport` given here is owned by the mailer from then on.
    """

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
            outcome = transport_outcome(e, "http")
        else:
            outcome = _response_outcome(response, key)
        level = logging.WARNING if outcome.failure_class is FailureClass.UNKNOWN else logging.DEBUG
        _event("provider_send", level, key=key, outcome=outcome.label, detail=outcome.detail)
        return outcome


def _body(message: Message) -> dict[str, Any]:
    body: dict[str, Any] = {
        "from": message.sender,
        "to": [message.recipient],
        "subject": message.subject,
        "text": message.text,
        "headers": {n: v for n, v in message.headers if n.lower() not in PROVIDER_HEADERS},
        "tags": [
            {"name": "operation_key", "value": _TAG_UNSAFE.sub("_", str(message.key))},
            {"name": "period", "value": str(message.key.period)},
        ],
    }
    if message.html is not None:
        body["html"] = message.html
    return body


def _response_outcome(response: httpx.Response, key: str) -> SendOutcome:
    status = response.status_code
    if response.is_success:
        provider_id = json_field(response, "id")
        if provider_id is None:
            return SendOutcome.failed(FailureClass.UNKNOWN, f"http:{status}:malformed_body")
        return SendOutcome.sent(provider_id)
    name = json_field(response, "name")
    name = name if name is not None and _ERROR_NAME.fullmatch(name) else None
    detail = f"http:{status}" + (f":{name}" if name else "")
    if status == 429:
        return SendOutcome.failed(
            FailureClass.THROTTLED,
            detail,
            retry_after=retry_after(response),
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
