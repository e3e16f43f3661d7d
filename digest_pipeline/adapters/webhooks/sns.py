r"""Amazon SNS's HTTP/S messages: parsed, and verified the way AWS documents it.

SNS signs `Name\nvalue\n` for a fixed list of fields per message `Type` (a Notification:
Message, MessageId, Subject if present, Timestamp, TopicArn, Type; a Subscription- or
UnsubscribeConfirmation: Message, MessageId, SubscribeURL, Timestamp, Token, TopicArn, Type)
with RSA PKCS#1 v1.5, over SHA-1 for `SignatureVersion` 1 and SHA-256 for 2, and sends the URL of
the certificate holding its public key. A signature proves only that *some* SNS topic sent the
message, since anyone can make a topic, so a message is accepted only from an allowed
`TopicArn`; and a certificate counts only when fetched over verified HTTPS from a host SNS
serves certificates from. The checks run cheapest first, so every refusal that needs no
certificate is decided before any fetch: the topic, the version, the certificate URL, the
timestamp, the subscribe URL; then the certificate (cached by URL), its validity at the
message's time, and the signature. `now` is handed in, never read here.

SNS sends a delivery again, with the same `Timestamp` and signature, for up to an hour (the
hard limit of an HTTP/S delivery policy), so a message may be that old plus the webhook
tolerance for clock skew and transit; a replay inside that window repeats a `MessageId` the
ledger has recorded and changes nothing. A message from the future is refused beyond the
tolerance.
"""

import base64
import binascii
import json
import re
import ssl
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Protocol
from urllib.parse import urlsplit

import httpx
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from digest_pipeline.domain.feedback import InvalidEvent
from digest_pipeline.domain.webhooks import Verdict

#: the header SNS names the message's type in; it must agree with the body's `Type`
MESSAGE_TYPE_HEADER = "x-amz-sns-message-type"
#: how long SNS goes on retrying one delivery: the HTTP/S delivery policy's hard limit
SNS_RETRY_SPAN = timedelta(hours=1)
#: an SNS signing certificate is about 2 KB of PEM; anything far larger is not one
MAX_CERT_BYTES = 64 * 1024
#: a subscription confirmation's answer is a short XML document
MAX_CONFIRM_BYTES = 64 * 1024
#: certificates kept in memory (SNS uses one per region, renewed about yearly)
CERT_CACHE_SIZE = 32
FETCH_TIMEOUT_SECONDS = 5.0

_HASHES: dict[str, type[hashes.SHA1] | type[hashes.SHA256]] = {
    "1": hashes.SHA1,
    "2": hashes.SHA256,
}
#: SNS writes milliseconds and `Z`; anything else is not SNS's
_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?Z")
_MESSAGE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
#: printable ASCII without spaces or backslashes: no URL parser can read such a URL two ways
_URL = re.compile(r"[!-\[\]-~]{1,2048}")
_MAX_FIELD = 256 * 1024
_MAX_SIGNATURE = 2048


class MessageType(StrEnum):
    """An SNS HTTP/S message's `Type`."""

    NOTIFICATION = "Notification"
    SUBSCRIPTION_CONFIRMATION = "SubscriptionConfirmation"
    UNSUBSCRIBE_CONFIRMATION = "UnsubscribeConfirmation"


#: the signed fields of each type, in the order AWS signs them
_SIGNED_FIELDS: dict[MessageType, tuple[str, ...]] = {
    MessageType.NOTIFICATION: ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"),
    MessageType.SUBSCRIPTION_CONFIRMATION: (
        "Message",
        "MessageId",
        "SubscribeURL",
        "Timestamp",
        "Token",
        "TopicArn",
        "Type",
    ),
}
_SIGNED_FIELDS[MessageType.UNSUBSCRIBE_CONFIRMATION] = _SIGNED_FIELDS[
    MessageType.SUBSCRIPTION_CONFIRMATION
]
_TYPES = frozenset(t.value for t in MessageType)
_ALWAYS = (
    "Type",
    "MessageId",
    "TopicArn",
    "Message",
    "Timestamp",
    "SignatureVersion",
    "Signature",
    "SigningCertURL",
)


@dataclass(frozen=True)
class SnsMessage:
    """An SNS message's fields as sent (the signed values exactly), and its time read."""

    type: MessageType
    #: every field the message carries that is a string, by name
    fields: Mapping[str, str]
    signed_at: datetime

    def __getitem__(self, name: str) -> str:
        return self.fields[name]

    @property
    def message_id(self) -> str:
        return self.fields["MessageId"]

    @property
    def topic_arn(self) -> str:
        return self.fields["TopicArn"]

    def string_to_sign(self) -> bytes:
        r"""`Name\nvalue\n` for each signed field the message has, in AWS's order."""
        return "".join(
            f"{name}\n{self.fields[name]}\n"
            for name in _SIGNED_FIELDS[self.type]
            if name in self.fields
        ).encode("utf-8")


def parse_message(body: bytes, header_type: str | None) -> SnsMessage:
    """The SNS message of a request body, whose type the `x-amz-sns-message-type` header names.

    Raises:
        InvalidEvent: not a JSON object with every field its type needs as a string, a type the
            header does not name, or a timestamp that is not SNS's. Nothing of the body is quoted.
    """
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        raise InvalidEvent("the body is not JSON") from None
    if not isinstance(payload, dict):
        raise InvalidEvent("the body is not an SNS message")
    given = payload.get("Type")
    if not isinstance(given, str) or given not in _TYPES:
        raise InvalidEvent("the body is not an SNS message type")
    kind = MessageType(given)
    if header_type != kind.value:
        raise InvalidEvent(f"the {MESSAGE_TYPE_HEADER} header does not name the body's Type")
    needed = _ALWAYS if kind is MessageType.NOTIFICATION else (*_ALWAYS, "SubscribeURL", "Token")
    for name in needed:
        value = payload.get(name)
        if not isinstance(value, str) or len(value) > _MAX_FIELD:
            raise InvalidEvent(f"the SNS message has no {name}")
    fields = {k: v for k, v in payload.items() if isinstance(v, str) and len(v) <= _MAX_FIELD}
    if not _MESSAGE_ID.fullmatch(fields["MessageId"]):
        raise InvalidEvent("the SNS message's MessageId is not an id")
    stamp = fields["Timestamp"]
    if not _TIMESTAMP.fullmatch(stamp):
        raise InvalidEvent("the SNS message's Timestamp is not an ISO 8601 UTC time")
    try:
        signed_at = datetime.fromisoformat(stamp)
    except ValueError:
        raise InvalidEvent("the SNS message's Timestamp is not an ISO 8601 UTC time") from None
    return SnsMessage(kind, fields, signed_at.astimezone(UTC))


class FetchFailed(Exception):
    """A certificate or confirmation URL could not be read; the message never repeats a body."""


class Fetcher(Protocol):
    """Reads one https URL; the verifier's only way out to the network."""

    def get(self, url: str) -> bytes:
        """The body of a 200 answer to a GET of `url`.

        Raises:
            FetchFailed: no answer, another status, or a body over the fetcher's cap.
        """
        ...


class HttpsFetcher:
    """GETs over httpx with TLS verified, no redirects, a short timeout and a size cap.

    `verify` is httpx's: True in production (certifi's CA bundle, or `SSL_CERT_FILE` /
    `SSL_CERT_DIR` where set; a proxy from the environment is used, as by the mailers' clients),
    an `ssl.SSLContext` with a test CA in the tests. A client is made per request: certificates
    are cached by the verifier, so a fetch is rare, and nothing is held between requests.
    """

    def __init__(
        self,
        *,
        verify: ssl.SSLContext | bool = True,
        timeout: float = FETCH_TIMEOUT_SECONDS,
        max_bytes: int = MAX_CERT_BYTES,
    ) -> None:
        self._verify, self._timeout, self._max_bytes = verify, timeout, max_bytes

    def get(self, url: str) -> bytes:
        try:
            with (
                httpx.Client(
                    verify=self._verify,
                    timeout=self._timeout,
                    follow_redirects=False,
                ) as client,
                client.stream("GET", url) as response,
            ):
                if response.status_code != 200:
                    raise FetchFailed(f"HTTP {response.status_code}")
                chunks: list[bytes] = []
                size = 0
                for chunk in response.iter_bytes():
                    size += len(chunk)
                    if size > self._max_bytes:
                        raise FetchFailed(f"larger than {self._max_bytes} bytes")
                    chunks.append(chunk)
                return b"".join(chunks)
        except httpx.HTTPError as e:
            raise FetchFailed(type(e).__name__) from e


class CertificateUnavailable(Exception):
    """The signing certificate could not be fetched or read: SNS should retry (HTTP 503)."""


@dataclass(frozen=True)
class Check:
    """What verifying a message found: ACCEPTED, or a refusal and a short word for the log."""

    verdict: Verdict
    why: str = ""


def url_host_matches(url: str, pattern: re.Pattern[str], *, path_suffix: str = "") -> bool:
    """Whether `url` is https, without userinfo, on a host `pattern` fullmatches.

    The host is matched as `host`, or as `host:port` when the URL names a port other than 443,
    so a port is allowed only where the pattern says so.
    """
    if not _URL.fullmatch(url):
        return False
    parts = urlsplit(url)
    if parts.scheme != "https" or "@" in parts.netloc or not parts.hostname:
        return False
    try:
        port = parts.port
    except ValueError:
        return False
    host = parts.hostname if port in (None, 443) else f"{parts.hostname}:{port}"
    return pattern.fullmatch(host) is not None and parts.path.endswith(path_suffix)


class SnsVerifier:
    """Verifies SNS messages from allowed topics, fetching and caching signing certificates."""

    def __init__(
        self,
        *,
        topics: frozenset[str],
        host_pattern: re.Pattern[str],
        fetcher: Fetcher,
        tolerance: timedelta,
        cache_size: int = CERT_CACHE_SIZE,
    ) -> None:
        self._topics, self._pattern, self._fetcher = topics, host_pattern, fetcher
        self._tolerance, self._cache_size = tolerance, cache_size
        self._certs: OrderedDict[str, x509.Certificate] = OrderedDict()
        self._lock = threading.Lock()

    def verify(self, message: SnsMessage, now: datetime) -> Check:
        """The verdict on `message` at `now`; the certificate is fetched past the cheap checks only.

        Raises:
            CertificateUnavailable: the certificate could not be fetched or is not one.
        """
        if message.topic_arn not in self._topics:
            return Check(Verdict.FORGED, "topic")
        algorithm = _HASHES.get(message["SignatureVersion"])
        if algorithm is None:
            return Check(Verdict.FORGED, "signature_version")
        if not url_host_matches(message["SigningCertURL"], self._pattern, path_suffix=".pem"):
            return Check(Verdict.FORGED, "cert_url")
        age = now - message.signed_at
        if age > SNS_RETRY_SPAN + self._tolerance or -age > self._tolerance:
            return Check(Verdict.EXPIRED, "timestamp")
        if message.type is MessageType.SUBSCRIPTION_CONFIRMATION and not url_host_matches(
            message["SubscribeURL"], self._pattern
        ):
            return Check(Verdict.FORGED, "subscribe_url")
        if len(message["Signature"]) > _MAX_SIGNATURE:
            return Check(Verdict.FORGED, "signature")
        try:
            signature = base64.b64decode(message["Signature"], validate=True)
        except (binascii.Error, ValueError):
            return Check(Verdict.FORGED, "signature")
        cert = self._certificate(message["SigningCertURL"])
        if not cert.not_valid_before_utc <= message.signed_at <= cert.not_valid_after_utc:
            return Check(Verdict.FORGED, "certificate")
        key = cert.public_key()
        if not isinstance(key, rsa.RSAPublicKey):
            return Check(Verdict.FORGED, "certificate")
        try:
            key.verify(signature, message.string_to_sign(), padding.PKCS1v15(), algorithm())
        except InvalidSignature:
            return Check(Verdict.FORGED, "signature")
        return Check(Verdict.ACCEPTED)

    def confirm(self, message: SnsMessage) -> None:
        """Confirms a verified subscription: a GET of its `SubscribeURL` (checked by `verify`).

        Raises:
            FetchFailed: SNS did not answer 200; the confirmation comes again on SNS's retry.
        """
        self._fetcher.get(message["SubscribeURL"])

    def _certificate(self, url: str) -> x509.Certificate:
        with self._lock:
            cert = self._certs.get(url)
            if cert is not None:
                self._certs.move_to_end(url)
                return cert
        try:
            pem = self._fetcher.get(url)
        except FetchFailed as e:
            raise CertificateUnavailable(f"the signing certificate cannot be fetched: {e}") from e
        try:
            cert = x509.load_pem_x509_certificate(pem)
        except ValueError as e:
            raise CertificateUnavailable("the signing certificate is not a PEM certificate") from e
        with self._lock:
            self._certs[url] = cert
            self._certs.move_to_end(url)
            while len(self._certs) > self._cache_size:
                self._certs.popitem(last=False)
        return cert
