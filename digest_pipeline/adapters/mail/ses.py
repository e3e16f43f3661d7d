"""The Amazon SES mailer: SES v2 `SendEmail` with the raw message and the operation key as a tag.

SES takes no idempotency key and cannot look a message up by a tag, so a send whose answer is
lost is never repeated: it comes back `unknown` and stays so until an SES event published through
the configuration set (SNS → `digest serve`'s `/events/ses`) names the key it echoes from
`EmailTags`, or an operator resolves it. Each send is exactly one HTTP request (boto3's retries
are off) and comes back as a classified `SendOutcome` (table below), never as an exception.
"""

# | SES / botocore says                                          | class     | detail                 |
# |--------------------------------------------------------------|-----------|------------------------|
# | 200 with a `MessageId`                                       | sent      | accepted, id recorded  |
# | 200 without one (it accepted the message)                    | sent      | accepted, no id        |
# | TooManyRequestsException, Throttling, ThrottlingException,   | throttled | ses:<Code>             |
# |   any 429 (`Retry-After` honoured when SES sends one)        |           |                        |
# | the same, its message "Daily message quota exceeded"         | throttled | ses:<Code>:daily_quota, quota |
# | LimitExceededException (an account limit)                    | throttled | ses:<Code>, quota      |
# | UnrecognizedClientException, InvalidSignatureException,      | permanent | ses:<Code>             |
# |   SignatureDoesNotMatch, AccessDenied(Exception),            |           |                        |
# |   ExpiredToken(Exception), InvalidClientTokenId, …           |           |                        |
# | SendingPausedException, AccountSuspendedException,           | permanent | ses:<Code>             |
# |   MailFromDomainNotVerifiedException, NotFoundException      |           |                        |
# |   (no such configuration set): all of these are the sender's credentials or account, so  |
# |   the breaker reads them as credential refusals, stops the run and the items are retried |
# | no credentials found, or they could not be fetched           | permanent | ses:no_credentials     |
# |   (nothing left: the same credential refusal)               |           |                        |
# | MessageRejected naming the sender's address (not verified,   | permanent | ses:MessageRejected:sender_refused |
# |   or not the account's to send from)                         |           |                        |
# |   (the sender's configuration: the breaker reads it as a credential refusal)             |
# | MessageRejected otherwise (content, an unverified recipient) | permanent | ses:MessageRejected    |
# | BadRequestException and any other 3xx/4xx                    | permanent | ses:<Code>             |
# | 408 (SES gave up reading the request: nothing queued)        | transient | ses:<Code>             |
# | InternalFailure, ServiceUnavailable, any 5xx                 | transient | ses:<Code>             |
# | EndpointConnectionError, ConnectTimeoutError,                | transient | ses:endpoint_connection_error, … |
# |   ProxyConnectionError, an SSLError of a refused certificate: |           |                        |
# |   the request never left                                     |           |                        |
# | a request botocore refuses to build (ParamValidationError)   | permanent | ses:param_validation_error |
# | a client that cannot be built (nothing left; credentials     | transient | ses:<error>            |
# |   aside): the breaker stops a run that fails so every time   |           |                        |
# | ReadTimeoutError, ConnectionClosedError, any other SSLError, | unknown   | ses:read_timeout_error, … |
# |   any other error (the request may have left and been accepted) |        |                        |
#
# A detail names SES's error code (`x-amzn-ErrorType`) or, without a usable one, the HTTP status:
# never SES's message text, which may quote an address. A 200 without `MessageId` is `sent`, as
# SendGrid's 202 without an id is: SES accepted it, and its events match by the tag anyway.
#
# SES refuses a send over the 24-hour quota with its throttling error and the text "Daily message
# quota exceeded" (the developer guide's "Errors related to the sending quotas"); that answer, and
# LimitExceededException, an account limit SES v2 models for SendEmail, are `throttled` with
# `quota`, as a provider's `daily_quota_exceeded` is: every sender of the install pauses
# (domain/pacing.py, an hour at a time) and the week waits for the quota's window to move on.
# `permanent` would fail customers for the account's quota; plain `throttled` would go on asking
# SES with every due item.

import logging
import re
import ssl
from collections.abc import Callable, Mapping
from datetime import timedelta
from email.utils import parseaddr
from functools import partial
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    CredentialRetrievalError,
    NoCredentialsError,
    ParamValidationError,
    PartialCredentialsError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError
from botocore.exceptions import SSLError as BotoSSLError

from digest_pipeline.adapters.mail.http_common import MAX_RETRY_AFTER, log_event
from digest_pipeline.adapters.mail.mime import to_bytes
from digest_pipeline.adapters.mail.provider_client import ClientMailer
from digest_pipeline.domain.breaker import SES_CREDENTIAL_CODES
from digest_pipeline.domain.errors import RenderError
from digest_pipeline.domain.failures import FailureClass, SendOutcome, render_failure_code
from digest_pipeline.domain.mailer_identity import fingerprint, mailer_identity
from digest_pipeline.domain.model import MailerCapabilities, Message
from digest_pipeline.domain.ses_tags import TAG_NAME, tag_value
from digest_pipeline.ports import Mailer
from digest_pipeline.ses_settings import SesSettings

logger = logging.getLogger("digest_pipeline.adapters.ses")

#: `max_pool_connections` when the caller names no concurrency (boto3's default is 10)
DEFAULT_CONNECTIONS = 16
#: the identity's credential part when the key id is not a stable name of the account: boto3's
#: default chain, or temporary keys (a role's key id changes with every rotation, and yesterday's
#: attempts would look like another mailer's)
ROTATING_CREDENTIALS = "rotating"
_THROTTLED = frozenset({"TooManyRequestsException", "Throttling", "ThrottlingException"})
_QUOTA = frozenset({"LimitExceededException"})
#: how SES's throttling answer says the 24-hour quota is spent, not the per-second rate
_DAILY_QUOTA = re.compile(r"daily message quota", re.IGNORECASE)
#: the suffix of a `MessageRejected` that refuses the sender's own address
SENDER_REFUSED = "sender_refused"
#: the error codes that refuse the sender's credentials or account: the breaker's list
CREDENTIAL_REFUSALS = SES_CREDENTIAL_CODES
#: the only error codes echoed into a detail: SES's names, never its free text
_ERROR_CODE = re.compile(r"[A-Za-z][A-Za-z0-9.]{0,63}")
_DELTA_SECONDS = re.compile(r"[0-9]{1,10}")
#: where a word of an exception's class name starts (an acronym is one word)
_WORD_START = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
#: raised before anything is signed: no credentials to sign with
_NO_CREDENTIALS = (NoCredentialsError, PartialCredentialsError, CredentialRetrievalError)


def _event(event: str, level: int = logging.INFO, **fields: object) -> None:
    log_event(logger, event, level, **fields)


class SesMailer(ClientMailer):
    """Sends through SES v2 over one boto3 `sesv2` client, built on the first send.

    A boto3 client is thread-safe; its session is not, so the client is built once under a lock.
    `close()` releases its connections (a later send builds a new client).
    """

    def __init__(self, settings: SesSettings, *, max_connections: int | None = None) -> None:
        super().__init__()
        self._settings = settings
        self._max_connections = max_connections or DEFAULT_CONNECTIONS

    @property
    def capabilities(self) -> MailerCapabilities:
        # no idempotency key and no lookup by tag: an `unknown` is settled by SES's events
        return MailerCapabilities(idempotency_window=None, can_lookup=False)

    @property
    def identity(self) -> str:
        """`ses:` and a digest of the region, the endpoint and the access key id.

        Another account's events know nothing of ours, and a key id names one account. It is read
        from the settings, never from a credential provider (which may ask a metadata service
        over the network): a long-term key configured in `AWS_ACCESS_KEY_ID` is fingerprinted;
        temporary keys and boto3's default chain name the account only by region and endpoint.
        """
        s = self._settings
        key_id = s.access_key_id if s.session_token is None else None
        credential = fingerprint(key_id) if key_id else ROTATING_CREDENTIALS
        return mailer_identity("ses", s.region, s.endpoint_url or "", credential)

    def recipe(self) -> Callable[[], Mailer] | None:
        return partial(SesMailer, self._settings, max_connections=self._max_connections)

    def prepare(self) -> None:
        # Loading the service model takes tens of milliseconds. With keys in the settings the
        # client opens nothing; boto3's default chain would resolve credentials as it is built,
        # which may ask the instance's metadata service, so the first send builds it instead.
        if self._settings.access_key_id is not None:
            try:
                self._ses()
            except (BotoCoreError, ValueError) as e:  # the first send reports it, classified
                _event("provider_prepare", logging.WARNING, error=type(e).__name__)

    def send(self, message: Message, *, idempotency_key: str) -> SendOutcome:
        key = str(message.key)
        if idempotency_key != key:
            _event("idempotency_key_mismatch", logging.ERROR, key=key)
            return SendOutcome.failed(FailureClass.PERMANENT, "ses:idempotency_key_mismatch")
        try:
            # the header rules every mailer applies (`check_message`), then the wire form; SES
            # asks for 7-bit parts in raw messages
            raw = to_bytes(message, seven_bit=True)
        except RenderError as e:
            return SendOutcome.failed(FailureClass.PERMANENT, render_failure_code(e))
        outcome = self._send(message, raw)
        level = logging.WARNING if outcome.failure_class is FailureClass.UNKNOWN else logging.DEBUG
        _event("provider_send", level, key=key, outcome=outcome.label, detail=outcome.detail)
        return outcome

    def _send(self, message: Message, raw: bytes) -> SendOutcome:
        try:
            client = self._ses()
        except Exception as e:  # nothing left; a run that cannot build one stops at its breaker
            _event("provider_client", logging.ERROR, key=message.key, error=type(e).__name__)
            return client_outcome(e)
        try:
            answer = client.send_email(**self.request(message, raw))
        except ClientError as e:
            return error_outcome(e.response, parseaddr(message.sender)[1] or message.sender)
        except Exception as e:  # botocore's transport and parsing errors: classified, never raised
            return transport_outcome(e)
        message_id = answer.get("MessageId") if isinstance(answer, dict) else None
        return SendOutcome.sent(message_id if isinstance(message_id, str) and message_id else None)

    def request(self, message: Message, raw: bytes) -> dict[str, Any]:
        """`SendEmail`'s parameters: the raw message to its one recipient, tagged with the key.

        The raw message keeps every header the composer wrote (List-Unsubscribe, Message-ID,
        X-Digest-Operation-Key). `FromEmailAddress` is the bare address, the identity SES
        checks; the From header keeps the display name.
        """
        params: dict[str, Any] = {
            "FromEmailAddress": parseaddr(message.sender)[1] or message.sender,
            "Destination": {"ToAddresses": [message.recipient]},
            "Content": {"Raw": {"Data": raw}},
            "EmailTags": [{"Name": TAG_NAME, "Value": tag_value(message.key)}],
        }
        if self._settings.configuration_set is not None:
            params["ConfigurationSetName"] = self._settings.configuration_set
        return params

    def _ses(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = self._new_client()
            return self._client

    def _new_client(self) -> Any:
        s = self._settings
        session = boto3.session.Session(
            aws_access_key_id=s.access_key_id,
            aws_secret_access_key=s.secret_access_key,
            aws_session_token=s.session_token,
            region_name=s.region,
        )
        config = Config(
            # the ledger owns retries: one HTTP request per send, whatever SES answers
            retries={"total_max_attempts": 1, "mode": "standard"},
            connect_timeout=s.timeout_seconds,
            read_timeout=s.timeout_seconds,
            max_pool_connections=self._max_connections,
            # only DIGEST_SES_ENDPOINT_URL moves the endpoint (AWS_ENDPOINT_URL* and a profile's
            # endpoint_url do not): the identity names where the messages go
            ignore_configured_endpoint_urls=True,
        )
        return session.client("sesv2", endpoint_url=s.endpoint_url, config=config)


def error_outcome(response: Mapping[str, Any], sender: str | None = None) -> SendOutcome:
    """What one SES error answer means (the module's table), from botocore's parsed response.

    `sender` is the bare From address: a `MessageRejected` whose text names that address refuses
    the sender's identity (unverified, or not the account's to send from), so every customer
    alike: the sender's configuration.
    """
    error, meta = response.get("Error"), response.get("ResponseMetadata")
    error = error if isinstance(error, Mapping) else {}
    meta = meta if isinstance(meta, Mapping) else {}
    status = meta.get("HTTPStatusCode")
    status = status if isinstance(status, int) else 0
    raw = error.get("Code")
    code = raw if isinstance(raw, str) and _ERROR_CODE.fullmatch(raw) else None
    detail = f"ses:{code or status}"
    if code in _QUOTA:
        return SendOutcome.failed(FailureClass.THROTTLED, detail, quota=True)
    if code in _THROTTLED or status == 429:
        text = error.get("Message")
        if isinstance(text, str) and _DAILY_QUOTA.search(text):
            # read, never echoed: SES names a spent quota only in its message text
            return SendOutcome.failed(FailureClass.THROTTLED, f"{detail}:daily_quota", quota=True)
        return SendOutcome.failed(
            FailureClass.THROTTLED, detail, retry_after=_retry_after(meta.get("HTTPHeaders"))
        )
    if status >= 500 or status == 408:
        return SendOutcome.failed(FailureClass.TRANSIENT, detail)
    if code == "MessageRejected" and _names_sender(error.get("Message"), sender):
        # read, never echoed: SES names the identity that failed its check only in the text
        return SendOutcome.failed(FailureClass.PERMANENT, f"{detail}:{SENDER_REFUSED}")
    return SendOutcome.failed(FailureClass.PERMANENT, detail)


def _names_sender(text: object, sender: str | None) -> bool:
    """Whether SES's text names the sender's own address: the identity SES refused.

    SES says so for an unverified sender ("Email address is not verified. The following
    identities failed the check …: <address>") and for one the account may not send from
    ("Did not have authority to send from email <address>").
    """
    if not isinstance(text, str) or not sender:
        return False
    # the whole address, not a tail of another (`news@…` inside a recipient's `fakenews@…`)
    # nor the start of a longer domain; a full stop after it ends the sentence
    whole = rf"(?<![\w.%+-]){re.escape(sender)}(?![\w-]|\.\w)"
    return re.search(whole, text, re.IGNORECASE) is not None


def client_outcome(error: Exception) -> SendOutcome:
    """A client that could not be built: credentials that could not be found, or `transient`."""
    if isinstance(error, _NO_CREDENTIALS):
        return SendOutcome.failed(FailureClass.PERMANENT, "ses:no_credentials")
    return SendOutcome.failed(FailureClass.TRANSIENT, f"ses:{_snake(error)}")


def _snake(error: Exception) -> str:
    """`ReadTimeoutError` → `read_timeout_error`, `SSLError` → `ssl_error`."""
    return _WORD_START.sub("_", type(error).__name__).lower()


def _refused_in_handshake(error: BaseException) -> bool:
    """Whether a TLS error is the handshake's refusal of the server's certificate.

    botocore raises one `SSLError` for every TLS failure, the handshake's and one that breaks
    the stream while the answer is read; only the first is certain to come before the request.
    """
    seen: set[int] = set()
    pending: list[object] = [error]
    while pending:
        current = pending.pop()
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, ssl.SSLCertVerificationError | ssl.CertificateError):
            return True
        kwargs = getattr(current, "kwargs", None)
        wrapped = kwargs.get("error") if isinstance(kwargs, dict) else None
        pending += [wrapped, current.__cause__, current.__context__, *current.args]
    return False


def transport_outcome(error: Exception) -> SendOutcome:
    """`transient` if the request never left, `permanent` if it could not be made, else `unknown`."""
    name = _snake(error)
    if isinstance(error, _NO_CREDENTIALS):
        return SendOutcome.failed(FailureClass.PERMANENT, "ses:no_credentials")
    if isinstance(error, ParamValidationError):
        return SendOutcome.failed(FailureClass.PERMANENT, f"ses:{name}")
    # A connection that never opened cannot have carried the request; after that, or for any
    # error botocore does not say happened first, the message may have been accepted. A TLS
    # error is either: only a refused certificate is sure to have stopped the request.
    never_left = isinstance(error, BotoConnectionError) and (
        not isinstance(error, BotoSSLError) or _refused_in_handshake(error)
    )
    failure = FailureClass.TRANSIENT if never_left else FailureClass.UNKNOWN
    return SendOutcome.failed(failure, f"ses:{name}")


def _retry_after(headers: object) -> timedelta | None:
    """`Retry-After` in delta-seconds, capped at a day; SES rarely sends one."""
    raw = str(headers.get("retry-after", "")).strip() if isinstance(headers, Mapping) else ""
    if not _DELTA_SECONDS.fullmatch(raw):
        return None
    return min(timedelta(seconds=int(raw)), MAX_RETRY_AFTER)
