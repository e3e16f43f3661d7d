"""The ASGI application of `digest serve`: one-click unsubscribe and provider webhooks, nothing else.

`POST /unsubscribe/{customer_id}?token=…` with the RFC 8058 body suppresses the customer (token
403, body 400, unknown customer 404, in that order, so a forged link learns nothing); a `GET` of
the same URL only shows a page with a button that makes that POST, since mail scanners follow
links. `POST /events/{provider}` takes the provider's signed webhook, under `svix-*` or
`webhook-*` headers (unknown provider 404, signature or replay window 401, body 400), and records
the event once; Postmark's (`/events/postmark`) carry HTTP basic auth instead of a signature
(domain/postmark_events.py); `POST /events/ses` takes Amazon SNS messages carrying SES events,
verified as AWS documents (adapters/webhooks/sns.py). Every refusal is decided before the ledger
is touched; responses carry no customer data. The blocking ledger calls run on worker threads, a
bounded number at a time (`ServeConfig.ledger_threads`).
"""

import functools
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from digest_pipeline.adapters.sql.engine import LedgerDatabaseError
from digest_pipeline.adapters.webhooks import sendgrid
from digest_pipeline.adapters.webhooks.sns import (
    MESSAGE_TYPE_HEADER,
    CertificateUnavailable,
    Fetcher,
    FetchFailed,
    HttpsFetcher,
    MessageType,
    SnsVerifier,
    parse_message,
)
from digest_pipeline.domain.errors import DigestError
from digest_pipeline.domain.feedback import InvalidEvent, ProviderEvent, parse_event
from digest_pipeline.domain.postmark_events import (
    PROVIDER as POSTMARK,
)
from digest_pipeline.domain.postmark_events import (
    basic_auth_matches,
    parse_postmark_event,
)
from digest_pipeline.domain.ses_events import PROVIDER as SES
from digest_pipeline.domain.ses_events import parse_ses_event
from digest_pipeline.domain.unsubscribe import LinkSecrets
from digest_pipeline.domain.webhooks import DEFAULT_TOLERANCE, Verdict, signed_request, verify
from digest_pipeline.ports import Clock, FeedbackStore, ReadModel, WorkQueue
from digest_pipeline.serve import pages
from digest_pipeline.serve.forms import is_one_click
from digest_pipeline.services.feedback import (
    EVENT_LEASE,
    EventResult,
    LinkCheck,
    check_link,
    record_event,
    unsubscribe,
)
from digest_pipeline.services.logs import step_log
from digest_pipeline.sns_settings import SnsSettings

T = TypeVar("T")
#: a one-click body is 26 bytes; a multipart one a few hundred
MAX_UNSUBSCRIBE_BODY = 8 * 1024
#: a provider event is a few kilobytes (Resend's carry headers and tags, never the content)
MAX_EVENT_BODY = 256 * 1024
#: a SendGrid event batch: up to about 768 KB
MAX_SENDGRID_BODY = 1024 * 1024
#: an SNS message: at most 256 KB of message and its envelope
MAX_SNS_BODY = 320 * 1024


@dataclass(frozen=True)
class ServeConfig:
    """What the application checks requests against (from `Settings`)."""

    unsubscribe_secret: str = field(repr=False)
    #: after a rotation, the secret it replaced: links it signed are accepted until
    #: `previous_secret_until` (the overlap the ledger records; services/link_secrets.py)
    previous_unsubscribe_secret: str | None = field(default=None, repr=False)
    previous_secret_until: datetime | None = None
    #: provider name -> its signing keys (two during a rotation)
    webhook_keys: Mapping[str, tuple[bytes, ...]] = field(default_factory=dict, repr=False)
    webhook_tolerance: timedelta = DEFAULT_TOLERANCE
    #: ledger calls in flight at once (the rest wait their turn in the event loop): 1 for
    #: SQLite, which takes one transaction at a time and would make the others busy-sleep
    ledger_threads: int = 8
    #: the SNS topics whose SES events `/events/ses` accepts (None: the route is 404)
    sns: SnsSettings | None = None
    #: how SNS certificates and subscribe URLs are fetched; None: over verified HTTPS (httpx)
    sns_fetcher: Fetcher | None = field(default=None, repr=False)


def _page(html: str, status: int) -> HTMLResponse:
    return HTMLResponse(html, status_code=status, headers=pages.HEADERS)


def _json(body: dict[str, Any], status: int, headers: dict[str, str] | None = None) -> Response:
    merged = {"Cache-Control": "no-store", **(headers or {})}
    return JSONResponse(body, status_code=status, headers=merged)


_LINK_REFUSALS = {
    LinkCheck.FORBIDDEN: (403, "This link is not valid"),
    LinkCheck.UNKNOWN_CUSTOMER: (404, "This link is not valid any more"),
}


class _Endpoints:
    """The two routes' handlers over the application's ports."""

    def __init__(
        self,
        config: ServeConfig,
        store: FeedbackStore,
        ledger: ReadModel,
        queue: WorkQueue,
        clock: Clock,
    ) -> None:
        self._config, self._store, self._ledger = config, store, ledger
        self._queue, self._clock = queue, clock
        self._limiter = anyio.CapacityLimiter(config.ledger_threads)
        # SendGrid's keys are public keys: parsed once, so a bad one stops the server at start
        self._sendgrid = tuple(
            sendgrid.parse_verification_key(k.decode("utf-8", "replace"))
            for k in config.webhook_keys.get(sendgrid.PROVIDER, ())
        )
        self._sns = (
            None
            if config.sns is None
            else SnsVerifier(
                topics=config.sns.topic_arns,
                host_pattern=config.sns.cert_host_pattern,
                fetcher=config.sns_fetcher or HttpsFetcher(),
                tolerance=config.webhook_tolerance,
            )
        )
        self._secrets = LinkSecrets(
            config.unsubscribe_secret,
            config.previous_unsubscribe_secret,
            config.previous_secret_until,
        )

    def _secret_of(self, customer_id: str, token: str) -> str | None:
        """The accepted secret that signed the link, or None (then the link is forged)."""
        return self._secrets.secret_of(customer_id, token, self._clock.now())

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on a worker thread, at most `ledger_threads` at a time."""
        return await anyio.to_thread.run_sync(functools.partial(fn, *args), limiter=self._limiter)

    async def _record(self, event: ProviderEvent, *, busy: int) -> Response:
        """Applies one event; its answer: 200 with the outcome, or `busy` with Retry-After.

        `busy` answers while another request is applying the same event: the status that brings
        the provider's retry.
        """
        result, outcome = await self._call(
            record_event, self._store, self._ledger, self._queue, self._clock, event
        )
        if result is EventResult.IN_PROGRESS:
            retry = str(int(EVENT_LEASE.total_seconds()))
            return _json({"error": "in_progress"}, busy, {"Retry-After": retry})
        answer: dict[str, Any] = {"outcome": None if outcome is None else outcome.value}
        if result is EventResult.DUPLICATE:
            answer["duplicate"] = True
        return _json(answer, 200)

    async def unsubscribe(self, request: Request) -> Response:
        if request.method == "POST":
            return await self._unsubscribe_post(request)
        # GET (and HEAD): a page only. Scanners and link previews follow GETs; none unsubscribes.
        return await self._unsubscribe_page(request)

    async def _unsubscribe_page(self, request: Request) -> Response:
        customer_id, token = _link(request)
        secret = self._secret_of(customer_id, token) or self._config.unsubscribe_secret
        check = await self._call(check_link, self._store, secret, customer_id, token)
        if check in _LINK_REFUSALS:
            status, title = _LINK_REFUSALS[check]
            return _page(pages.refused(title), status)
        return _page(pages.confirmation(), 200)

    async def _unsubscribe_post(self, request: Request) -> Response:
        customer_id, token = _link(request)
        body = await request.body()
        # the token first, for any id and any body: a forged link gets 403 and nothing else
        secret = self._secret_of(customer_id, token)
        if secret is None:
            return _page(pages.refused(_LINK_REFUSALS[LinkCheck.FORBIDDEN][1]), 403)
        if not is_one_click(request.headers.get("content-type"), body):
            return _page(pages.refused("Send List-Unsubscribe=One-Click to unsubscribe"), 400)
        done = await self._call(unsubscribe, self._store, self._clock, secret, customer_id, token)
        if isinstance(done, LinkCheck):
            status, title = _LINK_REFUSALS[done]
            return _page(pages.refused(title), status)
        return _page(pages.unsubscribed(), 200)

    async def event(self, request: Request) -> Response:
        provider = request.path_params["provider"]
        keys = self._config.webhook_keys.get(provider)
        if not keys:
            return _json({"error": "unknown_provider"}, 404)
        body = await request.body()
        parse: Callable[[object], ProviderEvent]
        if provider == POSTMARK:
            # Postmark signs nothing: the credentials in the webhook's URL are its proof
            if not basic_auth_matches(request.headers.get("authorization"), keys):
                step_log.warning("webhook_refused", provider=provider, why="basic_auth")
                return _json({"error": "unauthorized"}, 401, {"WWW-Authenticate": "Basic"})
            parse = parse_postmark_event
        else:
            signed = signed_request(request.headers, body)
            verdict = verify(signed, keys, self._clock.now(), self._config.webhook_tolerance)
            if verdict is not Verdict.ACCEPTED or signed.event_id is None:
                step_log.warning("webhook_refused", provider=provider, why=verdict.value)
                return _json({"error": f"signature_{verdict.value}"}, 401)
            parse = functools.partial(parse_event, provider, signed.event_id)
        try:
            event = parse(json.loads(body))
        except (ValueError, RecursionError) as e:
            # InvalidEvent names what is wrong; a JSON error only that the body is not JSON
            why = str(e) if isinstance(e, InvalidEvent) else "the body is not JSON"
            return _json({"error": "bad_event", "why": why}, 400)
        return await self._record(event, busy=409)

    async def sendgrid_events(self, request: Request) -> Response:
        """A signed batch of SendGrid events: verified once, then each event recorded once.

        An event of the batch that cannot be read is logged by position and set aside; the rest
        are recorded. While one is being recorded elsewhere the batch gets 409, and SendGrid's
        retry brings it whole again: the events already recorded are duplicates by their id.
        """
        provider, now = sendgrid.PROVIDER, self._clock.now()
        if not self._sendgrid:
            return _json({"error": "unknown_provider"}, 404)
        body = await request.body()
        signed = sendgrid.signed_batch(request.headers, body)
        verdict = sendgrid.verify(signed, self._sendgrid, now, self._config.webhook_tolerance)
        if verdict is not Verdict.ACCEPTED:
            step_log.warning("webhook_refused", provider=provider, why=verdict.value)
            return _json({"error": f"signature_{verdict.value}"}, 401)
        try:
            batch = sendgrid.parse_batch(provider, json.loads(body))
        except (ValueError, RecursionError) as e:
            why = str(e) if isinstance(e, InvalidEvent) else "the body is not JSON"
            return _json({"error": "bad_event", "why": why}, 400)
        for unread in batch.unread:
            step_log.info(
                "webhook_event_unread", provider=provider, index=unread.index, why=unread.why
            )
        for event in batch.events:
            result, _ = await self._call(
                record_event, self._store, self._ledger, self._queue, self._clock, event
            )
            if result is EventResult.IN_PROGRESS:
                retry = str(int(EVENT_LEASE.total_seconds()))
                return _json({"error": "in_progress"}, 409, {"Retry-After": retry})
        return _json({"recorded": len(batch.events), "unread": len(batch.unread)}, 200)

    async def ses_events(self, request: Request) -> Response:
        """An SNS message from an allowed topic: an SES event recorded once, or a subscription.

        SNS retries only an answer of 500 or more (or none), so everything SNS should send
        again is a 503: a certificate that cannot be fetched, a confirmation that did not go
        through, an event being recorded by another request. A refusal is final (401, 400).
        """
        if self._sns is None:
            return _json({"error": "unknown_provider"}, 404)
        verifier, now = self._sns, self._clock.now()
        body = await request.body()
        try:
            message = parse_message(body, request.headers.get(MESSAGE_TYPE_HEADER))
        except InvalidEvent as e:
            return _json({"error": "bad_event", "why": str(e)}, 400)
        try:
            # the certificate fetch is blocking I/O, done at most once per certificate URL
            check = await anyio.to_thread.run_sync(verifier.verify, message, now)
        except CertificateUnavailable as e:
            step_log.warning("sns_certificate_unavailable", why=e)
            return _json({"error": "unavailable"}, 503)
        if check.verdict is not Verdict.ACCEPTED:
            step_log.warning("webhook_refused", provider=SES, why=check.why)
            return _json({"error": f"signature_{check.verdict.value}"}, 401)
        if message.type is MessageType.UNSUBSCRIBE_CONFIRMATION:
            step_log.info("sns_unsubscribe_confirmation", topic=message.topic_arn)
            return _json({"outcome": None}, 200)
        if message.type is MessageType.SUBSCRIPTION_CONFIRMATION:
            try:
                await anyio.to_thread.run_sync(verifier.confirm, message)
            except FetchFailed as e:
                step_log.warning("sns_subscription_failed", topic=message.topic_arn, why=e)
                return _json({"error": "unavailable"}, 503)
            step_log.info("sns_subscription_confirmed", topic=message.topic_arn)
            return _json({"outcome": None}, 200)
        try:
            event = parse_ses_event(message.message_id, json.loads(message["Message"]))
        except (ValueError, RecursionError) as e:
            why = str(e) if isinstance(e, InvalidEvent) else "the SNS Message is not JSON"
            return _json({"error": "bad_event", "why": why}, 400)
        # a 409 would end SNS's retries: only a 5xx brings the message again
        return await self._record(event, busy=503)


def build_app(
    *, config: ServeConfig, store: FeedbackStore, ledger: ReadModel, queue: WorkQueue, clock: Clock
) -> Starlette:
    """The application over a feedback store, the ledger's reads and queue, and a clock."""
    endpoints = _Endpoints(config, store, ledger, queue, clock)
    return Starlette(
        routes=[
            Route(
                "/unsubscribe/{customer_id}",
                _guarded(endpoints.unsubscribe),
                methods=["GET", "POST"],
                max_body_size=MAX_UNSUBSCRIBE_BODY,
            ),
            # SendGrid posts batches of up to about 768 KB
            Route(
                "/events/sendgrid",
                _guarded(endpoints.sendgrid_events),
                methods=["POST"],
                max_body_size=MAX_SENDGRID_BODY,
            ),
            Route(
                "/events/ses",
                _guarded(endpoints.ses_events),
                methods=["POST"],
                max_body_size=MAX_SNS_BODY,
            ),
            Route(
                "/events/{provider}",
                _guarded(endpoints.event),
                methods=["POST"],
                max_body_size=MAX_EVENT_BODY,
            ),
        ],
    )


Endpoint = Callable[[Request], Awaitable[Response]]


def _guarded(endpoint: Endpoint) -> Endpoint:
    """`endpoint`, answering 503 with one log line when the ledger (or anything) fails.

    The line names the error's class, and its text only for the project's own errors (a ledger
    error's text is safe by design; any other text could quote a parameter). The provider
    retries a 503 and a person tries again; no traceback reaches the server's log.
    """

    @functools.wraps(endpoint)
    async def guarded(request: Request) -> Response:
        try:
            return await endpoint(request)
        except HTTPException:
            raise  # Starlette's own answers (413 for an oversized body)
        except ClientDisconnect:
            # the client left, or was cut off for sending too slowly (serve/guard.py), before
            # its body arrived: nothing was read or done, and the answer reaches no one
            step_log.info("request_abandoned", route=request.url.path.split("/")[1])
            return Response(status_code=408)
        except Exception as e:
            shown = str(e) if isinstance(e, DigestError | LedgerDatabaseError) else None
            step_log.error("serve_failed", error=type(e).__name__, detail=shown)
            return _json({"error": "unavailable"}, 503)

    return guarded


def _link(request: Request) -> tuple[str, str]:
    """The link's customer id (percent-decoded by the router) and its token ("" when absent)."""
    return request.path_params["customer_id"], request.query_params.get("token", "")
