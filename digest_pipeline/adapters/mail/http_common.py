"""What the HTTP email-API mailers share: transport-error classes, `Retry-After`, JSON fields, logs.

A request that never left the client cannot have been accepted (`transient`); after it left,
anything may have happened (`unknown`). Both the Resend-style mailer (http.py) and Postmark's
(postmark.py) classify transport errors and throttling answers with these helpers.
"""

import logging
import re
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from digest_pipeline.domain.failures import FailureClass, SendOutcome

NEVER_LEFT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.ProxyError)
#: a URL the client cannot use: nothing left either
MISCONFIGURED = (httpx.UnsupportedProtocol, httpx.InvalidURL)
_DELTA_SECONDS = re.compile(r"[0-9]{1,10}")
#: a larger Retry-After is read as this: a wild date must not push the schedule out of range
MAX_RETRY_AFTER = timedelta(days=1)
#: the provider stamps its own Date; one that changed per attempt would turn an idempotent
#: resend into a 409 `invalid_idempotent_request`
PROVIDER_HEADERS = frozenset({"date"})


def log_event(logger: logging.Logger, event: str, level: int, **fields: object) -> None:
    """The services' `event=<name> key=<operation key> k=v` format; no address, no API key."""
    if logger.isEnabledFor(level):
        parts = " ".join(f"{k}={v}" for k, v in fields.items() if v is not None)
        logger.log(level, "event=%s %s", event, parts)


def transport_outcome(error: httpx.HTTPError | httpx.InvalidURL, prefix: str) -> SendOutcome:
    """`transient` when the request never left, `unknown` otherwise; detail `<prefix>:<error>`."""
    code = re.sub(r"(?<!^)(?=[A-Z])", "_", type(error).__name__).lower()
    # A request that never left cannot have been accepted; after that, anything may have been.
    failure = (
        FailureClass.TRANSIENT
        if isinstance(error, NEVER_LEFT + MISCONFIGURED)
        else FailureClass.UNKNOWN
    )
    return SendOutcome.failed(failure, f"{prefix}:{code}")


def json_body(response: httpx.Response) -> dict[str, Any] | None:
    """The response's JSON object, or None for anything else."""
    try:
        body = response.json()
    except ValueError:  # JSON and UTF-8 decoding errors are both ValueErrors
        return None
    return body if isinstance(body, dict) else None


def json_field(response: httpx.Response, field: str) -> str | None:
    """A non-empty string field of the response's JSON object, or None."""
    body = json_body(response)
    value = body.get(field) if body is not None else None
    return value if isinstance(value, str) and value else None


def retry_after(response: httpx.Response) -> timedelta | None:
    """`Retry-After` as delta-seconds or an HTTP-date relative to `Date` (RFC 9110 §10.2.3)."""
    raw = response.headers.get("Retry-After", "").strip()
    if _DELTA_SECONDS.fullmatch(raw):
        return min(timedelta(seconds=int(raw)), MAX_RETRY_AFTER)
    at = http_date(raw)
    if at is None:
        return None
    answered = http_date(response.headers.get("Date", "")) or datetime.now(UTC)
    return min(max(at - answered, timedelta(0)), MAX_RETRY_AFTER)


def http_date(raw: str) -> datetime | None:
    """An HTTP-date (RFC 9110 §5.6.7) as an aware UTC datetime, or None for anything else."""
    if not raw:
        return None
    try:
        parsed = parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    # HTTP-dates are GMT; `-0000` parses as naive
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
