"""The SendGrid mailer: `POST /v3/mail/send` with the operation key in `custom_args`.

SendGrid takes no idempotency key and cannot look a message up by ours, so a send whose answer
is lost is never repeated: it comes back `unknown` and stays so until SendGrid's signed event
webhook (`adapters/webhooks/sendgrid.py`) reports `delivered` for the key it echoes from
`custom_args`, or an operator resolves it. Every reply and transport error comes back as a
classified `SendOutcome` (table below), never as an exception.
"""

# | SendGrid / the transport says                               | class     | detail                   |
# |-------------------------------------------------------------|-----------|--------------------------|
# | 2xx (202, no body) with `X-Message-Id`                      | sent      | accepted, id recorded    |
# | 2xx without `X-Message-Id` (it accepted the message)        | sent      | accepted, no id          |
# | 400 (`errors[0].field` names what it refused)               | permanent | sendgrid:400[:<field>]   |
# | 401, 403 (key refused, no permission, unverified sender)    | permanent | sendgrid:401, :403       |
# |   both are the sender's configuration: the breaker stops the run, the item is retried   |
# | 413 (the payload is too large)                              | permanent | sendgrid:413             |
# | 429 (`X-RateLimit-Reset`, Unix seconds, else `Retry-After`) | throttled | sendgrid:429             |
# | 408 (SendGrid gave up reading the request: nothing queued)  | transient | sendgrid:408             |
# | 5xx                                                         | transient | sendgrid:<status>        |
# | any other 3xx (redirects are not followed) or 4xx           | permanent | sendgrid:<status>[:<field>] |
# | ConnectError, ConnectTimeout, PoolTimeout, ProxyError,      | transient | sendgrid:connect_error   |
# |   UnsupportedProtocol, InvalidURL: the request never left   |           |                          |
# | ReadTimeout, WriteTimeout, ReadError, RemoteProtocolError   | unknown   | sendgrid:read_timeout    |
# |   and any other httpx error (it may have been accepted)     |           |                          |
#
# A 2xx without `X-Message-Id` is `sent`: SendGrid's 202 is its acceptance, and the id serves only
# to match events, which match by the `operation_key` SendGrid echoes from `custom_args` anyway.
# `unknown` would hand an accepted message to an operator, and a resend would be a duplicate.

import logging
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import parseaddr
from functools import partial
from typing import Any

import httpx

from digest_pipeline.adapters.mail.http_common import (
    MAX_RETRY_AFTER,
    PROVIDER_HEADERS,
    http_date,
    json_body,
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

logger = logging.getLogger("digest_pipeline.adapters.sendgrid")

SEND_PATH = "/v3/mail/send"
#: the `custom_args` field SendGrid echoes at the top level of every event of the message
KEY_ARG = "operation_key"
#: headers SendGrid refuses in `headers` (its v3 reference: a 400), those it stamps itself
#: (`Date`), and `Message-ID`, which SendGrid may replace with its own: the duplicate-detection
#: header `X-Digest-Operation-Key` travels instead
RESERVED_HEADERS = PROVIDER_HEADERS | frozenset(
    {
        "x-sg-id",
        "x-sg-eid",
        "received",
        "dkim-signature",
        "content-type",
        "content-transfer-encoding",
        "to",
        "from",
        "subject",
        "reply-to",
        "cc",
        "bcc",
        "message-id",
    }
)
#: the only error fields echoed into a detail: SendGrid's JSON paths, never its free text
_FIELD = re.compile(r"[A-Za-z0-9_.\[\]-]{1,64}")
_EPOCH_SECONDS = re.compile(r"[0-9]{1,12}")
#: the statuses whose class does not follow from 4xx/5xx alone
_SPECIAL = {429: FailureClass.THROTTLED, 408: FailureClass.TRANSIENT}


def _event(event: str, level: int = logging.INFO, **fields: object) -> None:
    log_event(logger, event, level, **fields)


class SendGridMailer(ProviderClientMailer):
    """Sends through SendGrid's v3 API over one pooled, thread-safe `httpx.Client`.

    `settings.url` is the API's base (`https://api.sendgrid.com`); `idempotency_window` is not
    used, since SendGrid has none. The client is created on the first send; `close()` releases
    it. A `transport` given here is owned by the mailer from then on.
    """

    @property
    def capabilities(self) -> MailerCapabilities:
        return MailerCapabilities(idempotency_window=None, can_lookup=False)

    @property
    def identity(self) -> str:
        # another key may be another account (or subuser), whose events know nothing of ours
        return mailer_identity("sendgrid", self._settings.url, fingerprint(self._settings.api_key))

    def recipe(self) -> Callable[[], Mailer] | None:
        # a transport handed in (a test's stand-in provider) stays in this process
        return None if self._transport is not None else partial(SendGridMailer, self._settings)

    def send(self, message: Message, *, idempotency_key: str) -> SendOutcome:
        key = str(message.key)
        if idempotency_key != key:
            _event("idempotency_key_mismatch", logging.ERROR, key=key)
            return SendOutcome.failed(FailureClass.PERMANENT, "sendgrid:idempotency_key_mismatch")
        try:
            # the header rules every mailer applies; SendGrid builds the MIME message itself
            check_message(message)
        except RenderError as e:
            return SendOutcome.failed(FailureClass.PERMANENT, render_failure_code(e))
        try:
            response = self._http().post(SEND_PATH, json=request_body(message))
        except (httpx.HTTPError, httpx.InvalidURL) as e:
            outcome = transport_outcome(e, "sendgrid")
        else:
            outcome = response_outcome(response)
        level = logging.WARNING if outcome.failure_class is FailureClass.UNKNOWN else logging.DEBUG
        _event("provider_send", level, key=key, outcome=outcome.label, detail=outcome.detail)
        return outcome


def _address(text: str) -> dict[str, str]:
    """`{"email": …, "name": …}` of an RFC 5322 address (`Shop <digest@shop.example>`)."""
    name, email = parseaddr(text)
    return {"email": email or text, **({"name": name} if name else {})}


def request_body(message: Message) -> dict[str, Any]:
    """The v3 mail/send body: one personalization, text before html, tracking off."""
    content = [{"type": "text/plain", "value": message.text}]
    if message.html is not None:
        content.append({"type": "text/html", "value": message.html})
    return {
        "personalizations": [{"to": [{"email": message.recipient}]}],
        "from": _address(message.sender),
        "subject": message.subject,
        "content": content,
        "headers": {n: v for n, v in message.headers if n.lower() not in RESERVED_HEADERS},
        "custom_args": {KEY_ARG: str(message.key)},
        # a digest's links are not rewritten and it carries no pixel; its own one-click
        # unsubscribe stands, so SendGrid adds no link of its own either
        "tracking_settings": {
            "click_tracking": {"enable": False, "enable_text": False},
            "open_tracking": {"enable": False},
            "subscription_tracking": {"enable": False},
        },
    }


def response_outcome(response: httpx.Response) -> SendOutcome:
    """What one SendGrid answer means (the module's table)."""
    status = response.status_code
    if response.is_success:
        return SendOutcome.sent(response.headers.get("X-Message-Id") or None)
    field = _first_error_field(response) if 400 <= status < 500 else None
    detail = f"sendgrid:{status}" + (f":{field}" if field else "")
    if status == 429:
        return SendOutcome.failed(
            FailureClass.THROTTLED, detail, retry_after=_rate_limit_reset(response)
        )
    failure = _SPECIAL.get(status)
    if failure is None:
        failure = FailureClass.TRANSIENT if status >= 500 else FailureClass.PERMANENT
    return SendOutcome.failed(failure, detail)


def _first_error_field(response: httpx.Response) -> str | None:
    """`errors[0].field` when it is a short JSON path; never the message or help text."""
    body = json_body(response)
    errors = body.get("errors") if body is not None else None
    first = errors[0] if isinstance(errors, list) and errors else None
    field = first.get("field") if isinstance(first, dict) else None
    return field if isinstance(field, str) and _FIELD.fullmatch(field) else None


def _rate_limit_reset(response: httpx.Response) -> timedelta | None:
    """`X-RateLimit-Reset` (Unix seconds) less the answer's `Date`; else `Retry-After`."""
    raw = response.headers.get("X-RateLimit-Reset", "").strip()
    if not _EPOCH_SECONDS.fullmatch(raw):
        return retry_after(response)
    answered = http_date(response.headers.get("Date", "")) or datetime.now(UTC)
    # compared as seconds: a far-off reset must be capped, not overflow a datetime
    wait = min(max(int(raw) - answered.timestamp(), 0.0), MAX_RETRY_AFTER.total_seconds())
    return timedelta(seconds=round(wait))
