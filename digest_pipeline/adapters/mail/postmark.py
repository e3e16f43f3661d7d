"""The Postmark mailer: `POST /email` with the operation key in `Metadata`, looked up by search.

Postmark takes no idempotency key, so a send whose answer is lost is never repeated blindly: it
comes back `unknown` and reconciliation asks Postmark's outbound message search for the key's
`Metadata.operation_key` (`lookup`), which settles it as sent (found) or due again (not found).
Every reply and transport error comes back as a classified `SendOutcome` (table below).
"""

# | Postmark / the transport says                               | class     | detail                 |
# |-------------------------------------------------------------|-----------|------------------------|
# | 200 with `ErrorCode: 0` and a `MessageID`                   | sent      | accepted               |
# | 200 otherwise (it answered, the body says nothing usable)   | unknown   | postmark:200:malformed |
# | 401 (missing or wrong server token; `ErrorCode` 10)         | permanent | postmark:401[:10]      |
# | 422 `ErrorCode` 10 (bad or missing server token)            | permanent | postmark:422:10        |
# | 422 `ErrorCode` 400, 401 (sender signature not found, not   | permanent | postmark:422:<code>    |
# |   confirmed), 405 (not allowed to send: no credits), 412    |           |                        |
# |   (account pending), 413 (account may not send)             |           |                        |
# |   all of these are the sender's credentials or account, never the customer's: the breaker |
# |   reads them as credential refusals, stops the run, and the item is retried later          |
# | 422 `ErrorCode` 406 (inactive recipient: bounced, complained, unsubscribed)  | permanent | postmark:422:406 |
# | 422 `ErrorCode` 300 (invalid email request) and any other 422 code | permanent | postmark:422:<code> |
# | 429 (rate limit; `Retry-After` honoured)                    | throttled | postmark:429[:<code>]  |
# | 500, 503 and any other 5xx                                  | transient | postmark:<status>      |
# | any other status (redirects are not followed)               | permanent | postmark:<status>      |
# | ConnectError, ConnectTimeout, PoolTimeout, ProxyError,      | transient | postmark:connect_error |
# |   UnsupportedProtocol, InvalidURL: the request never left   |           |                        |
# | ReadTimeout, WriteTimeout, ReadError, RemoteProtocolError   | unknown   | postmark:read_timeout  |
# |   and any other httpx error (it may have been accepted)     |           |                        |

import hashlib
import logging
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import Any

import httpx

from digest_pipeline.adapters.mail.http_common import (
    PROVIDER_HEADERS,
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
from digest_pipeline.domain.model import LookupResult, LookupStatus, MailerCapabilities, Message
from digest_pipeline.ports import Mailer

logger = logging.getLogger("digest_pipeline.adapters.postmark")

#: the Metadata field that carries the operation key (Postmark: field names of 20 characters)
METADATA_FIELD = "operation_key"
#: how long Postmark's outbound search may take to list a message it accepted: a "not found"
#: about a younger attempt leaves the item `unknown` for a later pass (a resend could double it)
LOOKUP_LAG = timedelta(minutes=5)
#: Postmark refuses a Metadata value longer than this
_MAX_METADATA_VALUE = 80
#: the only error codes echoed into a detail: Postmark's numbers, never its free text
_MAX_ERROR_CODE = 100_000


def metadata_value(key: str) -> str:
    """What `Metadata.operation_key` holds for `key`: the key, or its digest when too long.

    A customer id of up to 128 characters makes a key longer than Postmark's 80; such a key is
    named by 32 hex digits of its SHA-256 (as `domain.model.key_digest`), in sends and lookups alike.
    """
    if len(key) <= _MAX_METADATA_VALUE:
        return key
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()[:32]


def _event(event: str, level: int = logging.INFO, **fields: object) -> None:
    log_event(logger, event, level, **fields)


class PostmarkMailer(ProviderClientMailer):
    """Sends through Postmark's API over one pooled, thread-safe `httpx.Client`.

    The client is created on the first send, not in the constructor; `close()` releases it (a
    later send opens a new one). A `transport` given here is owned by the mailer from then on.
    """

    @property
    def capabilities(self) -> MailerCapabilities:
        # no idempotency key at all: an uncertain send is settled only by `lookup`
        return MailerCapabilities(idempotency_window=None, can_lookup=True, lookup_lag=LOOKUP_LAG)

    @property
    def identity(self) -> str:
        # A server token names one Postmark server (its messages, its search); the stream is in
        # too, since the search is asked within it: another stream's "not found" is no evidence.
        token = fingerprint(self._settings.api_key)
        return mailer_identity("postmark", self._settings.url, token, self._settings.message_stream)

    def recipe(self) -> Callable[[], Mailer] | None:
        # a transport handed in (a test's stand-in provider) stays in this process
        return None if self._transport is not None else partial(PostmarkMailer, self._settings)

    def send(self, message: Message, *, idempotency_key: str) -> SendOutcome:
        key = str(message.key)
        if idempotency_key != key:
            _event("idempotency_key_mismatch", logging.ERROR, key=key)
            return SendOutcome.failed(FailureClass.PERMANENT, "postmark:idempotency_key_mismatch")
        try:
            # Postmark builds the MIME message from the JSON fields and checks the addresses
            check_message(message)
        except RenderError as e:
            return SendOutcome.failed(FailureClass.PERMANENT, render_failure_code(e))
        try:
            response = self._http().post("/email", json=self._body(message))
        except (httpx.HTTPError, httpx.InvalidURL) as e:
            outcome = transport_outcome(e, "postmark")
        else:
            outcome = _response_outcome(response)
        level = logging.WARNING if outcome.failure_class is FailureClass.UNKNOWN else logging.DEBUG
        _event("provider_send", level, key=key, outcome=outcome.label, detail=outcome.detail)
        return outcome

    def lookup(self, idempotency_key: str) -> LookupResult:
        """Searches the stream's outbound messages for the key's Metadata.

        FOUND with the MessageID, or NOT_FOUND when Postmark has none; any failure to ask, or
        an answer that is not clearly either, is UNSUPPORTED: no evidence, the item stays `unknown`.
        """
        value = metadata_value(idempotency_key)
        params = {
            "count": "1",
            "offset": "0",
            f"metadata_{METADATA_FIELD}": value,
            "messagestream": self._settings.message_stream,
        }
        try:
            response = self._http().get("/messages/outbound", params=params)
        except (httpx.HTTPError, httpx.InvalidURL) as e:
            detail = transport_outcome(e, "postmark").detail
            _event("provider_lookup", logging.WARNING, key=idempotency_key, detail=detail)
            return LookupResult(LookupStatus.UNSUPPORTED)
        result = _lookup_result(response, value)
        level = logging.WARNING if result.status is LookupStatus.UNSUPPORTED else logging.INFO
        _event(
            "provider_lookup",
            level,
            key=idempotency_key,
            status=result.status.value,
            http_status=response.status_code,
        )
        return result

    def _auth_headers(self) -> dict[str, str]:
        return {
            "X-Postmark-Server-Token": self._settings.api_key,
            "Accept": "application/json",
            "Content-Type": "application/json",
        }

    def _body(self, message: Message) -> dict[str, Any]:
        body: dict[str, Any] = {
            "From": message.sender,
            "To": message.recipient,
            "Subject": message.subject,
            "TextBody": message.text,
            "Headers": [
                {"Name": n, "Value": v}
                for n, v in message.headers
                if n.lower() not in PROVIDER_HEADERS
            ],
            "MessageStream": self._settings.message_stream,
            "Metadata": {METADATA_FIELD: metadata_value(str(message.key))},
            "TrackOpens": False,
            "TrackLinks": "None",
        }
        if message.html is not None:
            body["HtmlBody"] = message.html
        return body


def _error_code(body: dict[str, Any] | None) -> int | None:
    code = body.get("ErrorCode") if body is not None else None
    # bool is an int: `true` is no error code
    if isinstance(code, int) and not isinstance(code, bool) and 0 <= code < _MAX_ERROR_CODE:
        return code
    return None


def _response_outcome(response: httpx.Response) -> SendOutcome:
    status = response.status_code
    body = json_body(response)
    code = _error_code(body)
    if response.is_success:
        message_id = body.get("MessageID") if body is not None else None
        if code == 0 and isinstance(message_id, str) and message_id:
            return SendOutcome.sent(message_id)
        return SendOutcome.failed(FailureClass.UNKNOWN, f"postmark:{status}:malformed")
    detail = f"postmark:{status}" + (f":{code}" if code is not None else "")
    if status == 429:
        return SendOutcome.failed(FailureClass.THROTTLED, detail, retry_after=retry_after(response))
    if status >= 500:
        return SendOutcome.failed(FailureClass.TRANSIENT, detail)
    return SendOutcome.failed(FailureClass.PERMANENT, detail)


def _lookup_result(response: httpx.Response, value: str) -> LookupResult:
    body = json_body(response) if response.status_code == 200 else None
    if body is None:
        return LookupResult(LookupStatus.UNSUPPORTED)
    total, messages = body.get("TotalCount"), body.get("Messages")
    if total == 0 and messages == []:
        return LookupResult(LookupStatus.NOT_FOUND)
    for found in messages if isinstance(messages, list) else []:
        if not isinstance(found, dict):
            continue
        metadata, message_id = found.get("Metadata"), found.get("MessageID")
        # the search's own matching is not ours to trust: the value must be the key's exactly
        if (
            isinstance(metadata, dict)
            and metadata.get(METADATA_FIELD) == value
            and isinstance(message_id, str)
            and message_id
        ):
            return LookupResult(LookupStatus.FOUND, message_id)
    return LookupResult(LookupStatus.UNSUPPORTED)
