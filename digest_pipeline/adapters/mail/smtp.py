"""SMTP delivery through `smtplib`, every failure classified by the stage where it happened.

SMTP has no idempotency key and no lookup, so what matters is telling "the relay never took the
message" from "it may have": only a timeout or drop after the body's terminating dot reached the
socket, before the final reply, is `unknown` (design §2) and goes to the operator. The bytes
sent are 7-bit unless the relay offers 8BITMIME (RFC 6152), and a configured DKIM key signs
exactly those bytes (RFC 6376); the HTTP provider path leaves both to the provider.
"""

import contextlib
import logging
import re
import smtplib
import socket
import ssl
import threading
from collections.abc import Callable
from email.utils import parseaddr
from functools import partial

import dkim  # type: ignore[import-untyped]  # dkimpy ships no type information

from digest_pipeline.adapters.mail.mime import to_bytes
from digest_pipeline.dkim_settings import DkimSettings
from digest_pipeline.domain.errors import RenderError
from digest_pipeline.domain.failures import (
    INVALID_RECIPIENT,
    FailureClass,
    SendOutcome,
    render_failure_code,
)
from digest_pipeline.domain.mailer_identity import mailer_identity
from digest_pipeline.domain.model import MailerCapabilities, Message
from digest_pipeline.ports import Mailer
from digest_pipeline.settings import SMTP_SECURITY, SmtpSettings

logger = logging.getLogger(__name__)
_LOG_FORMAT = "event=smtp_send_failed key=%s stage=%s failure_class=%s detail=%s error=%s"

# Reply codes → failure class. RFC 5321 §4.2.1: 2yz completed, 4yz transient, 5yz permanent;
# RFC 3463 §2: the enhanced status class.subject.detail (e.g. 5.1.1 unknown user) agrees with it
# and is kept in `detail` as `smtp:550:5.1.1`. No server text ever goes into `detail`.
#
# | reply or event                                   | stage               | class     |
# |--------------------------------------------------|---------------------|-----------|
# | 2yz                                              | final reply         | sent      |
# | 452 storage/too many, 454 temporary (throttling) | any                 | throttled |
# | 421 closing (§4.2.2), 450, 451, other 4yz        | any                 | transient |
# | 5yz: 535 auth, 550, 551, 552, 553, 554           | any                 | permanent |
# | refused/reset/timeout, TLS error, drop           | before the dot      | transient |
# | timeout or drop with no final reply              | after the dot       | unknown   |
THROTTLING = frozenset({452, 454})
#: the detail of a sender address an SMTP envelope cannot carry (DIGEST_FROM_ADDRESS)
BAD_ENVELOPE_SENDER = "smtp:bad_envelope_sender"
#: the headers the DKIM signature covers, each also when absent, so a relay cannot add one
#: (RFC 6376 §5.4: a name listed once more than it occurs signs its absence)
SIGNED_HEADERS = (
    "From",
    "To",
    "Subject",
    "Date",
    "Message-ID",
    "List-Unsubscribe",
    "List-Unsubscribe-Post",
    "MIME-Version",
    "Content-Type",
    "X-Digest-Operation-Key",
)
# dkimpy logs the signed headers at debug level, addresses included: this logger drops them
_DKIM_LOG = logging.Logger("digest_pipeline.dkim_quiet", level=logging.CRITICAL + 1)
_ENHANCED = re.compile(rb"\s*([245])\.\d{1,3}\.\d{1,3}(?=\s|$)")
_CONNECT_ERRORS = (  # most specific first: SSLCertVerificationError is an SSLError
    (ConnectionRefusedError, "connect_refused"),
    (ssl.SSLCertVerificationError, "tls_verify_failed"),
    (ssl.SSLError, "tls_error"),
    (socket.gaierror, "dns_error"),
    (ConnectionResetError, "connect_reset"),
    (smtplib.SMTPServerDisconnected, "connect_dropped"),
)


class _Stop(Exception):
    """A reply (or a refused feature) ended the transaction; the socket may still be usable."""

    def __init__(self, failure_class: FailureClass, detail: str, code: int | None = None) -> None:
        super().__init__(detail)
        self.failure_class, self.detail, self.code = failure_class, detail, code


def _reply_stop(code: int, text: bytes | str) -> _Stop:
    raw = text.encode("utf-8", "replace") if isinstance(text, str) else text
    enhanced, detail = _ENHANCED.match(raw), f"smtp:{code}"
    if enhanced and enhanced.group(1) == str(code)[:1].encode():
        detail += ":" + enhanced.group(0).strip().decode("ascii")
    if code in THROTTLING:
        return _Stop(FailureClass.THROTTLED, detail, code)
    permanent = 500 <= code < 600
    return _Stop(FailureClass.PERMANENT if permanent else FailureClass.TRANSIENT, detail, code)


def _expect(reply: tuple[int, bytes], low: int, high: int) -> None:
    if not low <= reply[0] <= high:
        raise _reply_stop(*reply)


def _timed_out(error: BaseException | None) -> bool:
    while error is not None:  # smtplib wraps socket timeouts in SMTPServerDisconnected
        if isinstance(error, TimeoutError):
            return True
        error = error.__cause__ or error.__context__
    return False


def _error_outcome(error: Exception, stage: str) -> SendOutcome:
    what = "timeout" if _timed_out(error) else "dropped"
    if stage == "final":  # the dot reached the socket: the relay may have accepted the message
        if isinstance(error, smtplib.SMTPResponseException):
            what = "bad_reply"
        return SendOutcome.failed(FailureClass.UNKNOWN, f"smtp:{what}_after_data")
    if isinstance(error, smtplib.SMTPResponseException):  # greeting, EHLO or AUTH refused
        stop = _reply_stop(error.smtp_code, error.smtp_error)
        return SendOutcome.failed(stop.failure_class, stop.detail)
    if stage != "connect":
        return SendOutcome.failed(
            FailureClass.TRANSIENT, f"smtp:{what}{'_during_data' if stage == 'body' else ''}"
        )
    names = [name for kind, name in _CONNECT_ERRORS if isinstance(error, kind)]
    name = "connect_timeout" if what == "timeout" else (names or ["connect_error"])[0]
    return SendOutcome.failed(FailureClass.TRANSIENT, f"smtp:{name}")


def _plain_address(address: str) -> bool:
    return bool(address) and address.isascii() and not any(c in address for c in "\r\n<>")


def _envelope_refusal(sender: str, recipient: str) -> str | None:
    """The detail of an envelope address MAIL FROM or RCPT TO cannot carry, or None.

    A sender's is the configuration's fault and fails every message alike (the breaker stops
    the run); a recipient's (not ASCII, and this mailer never asks for SMTPUTF8) is that
    customer's alone.
    """
    if not _plain_address(sender):
        return BAD_ENVELOPE_SENDER
    if not _plain_address(recipient):
        return INVALID_RECIPIENT
    return None


def _dot_stuffed(payload: bytes) -> bytes:
    """RFC 5321 §4.5.2 transparency and the terminating `<CRLF>.<CRLF>`, as `SMTP.data` does."""
    body = re.sub(rb"(?m)^\.", b"..", payload)
    return body + (b"" if body.endswith(b"\r\n") else b"\r\n") + b".\r\n"


def _signed(payload: bytes, key: DkimSettings) -> bytes:
    """`payload` with a DKIM-Signature header first, over the bytes exactly as they are sent."""
    header: bytes = dkim.sign(
        payload,
        key.selector.encode("ascii"),
        key.domain.encode("ascii"),
        key.private_key,
        canonicalize=(b"relaxed", b"relaxed"),
        signature_algorithm=key.algorithm,
        include_headers=[name.encode("ascii") for name in SIGNED_HEADERS],
        logger=_DKIM_LOG,
    )
    return header + payload


def _logged(
    key: str, stage: str, outcome: SendOutcome, error: BaseException | None = None
) -> SendOutcome:
    # Only the key, the stage and short codes: a server's text may echo the address.
    level = logging.WARNING if outcome.failure_class is FailureClass.UNKNOWN else logging.INFO
    fields = (key, stage, outcome.label, outcome.detail, type(error).__name__ if error else "-")
    logger.log(level, _LOG_FORMAT, *fields)
    return outcome


def _replies_250(conn: smtplib.SMTP, command: str) -> bool:
    try:
        return conn.docmd(command)[0] == 250
    except (smtplib.SMTPException, OSError):
        return False


class SmtpMailer(Mailer):
    """Sends through one relay; one reused connection per thread, reopened after any error."""

    def __init__(
        self, settings: SmtpSettings, *, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        if settings.security not in SMTP_SECURITY:
            raise ValueError(f"SMTP security must be one of {', '.join(SMTP_SECURITY)}")
        self._settings, self._ssl_context = settings, ssl_context
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: list[smtplib.SMTP] = []

    @property
    def capabilities(self) -> MailerCapabilities:
        return MailerCapabilities(idempotency_window=None, can_lookup=False)

    @property
    def identity(self) -> str:
        s = self._settings
        return mailer_identity("smtp", s.host, str(s.port), s.username or "")

    def recipe(self) -> Callable[[], Mailer] | None:
        # a TLS context handed in (a test's own CA) cannot be sent to another process
        return None if self._ssl_context is not None else partial(SmtpMailer, self._settings)

    def send(self, message: Message, *, idempotency_key: str) -> SendOutcome:
        try:  # first: a refusal is `permanent`, not `unknown`, only because nothing has left
            payload = to_bytes(message)
        except RenderError as e:
            outcome = SendOutcome.failed(FailureClass.PERMANENT, render_failure_code(e))
            return _logged(idempotency_key, "render", outcome, e.__cause__ or e)
        sender = parseaddr(message.sender)[1]
        if (refused := _envelope_refusal(sender, message.recipient)) is not None:
            outcome = SendOutcome.failed(FailureClass.PERMANENT, refused)
            return _logged(idempotency_key, "envelope", outcome)
        stage, conn = "connect", None
        try:
            conn = self._connection()
            stage = "mail"
            eight_bit = not payload.isascii()
            if eight_bit and not conn.has_extn("8bitmime"):
                payload, eight_bit = to_bytes(message, seven_bit=True), False
            if self._settings.dkim is not None:
                payload = _signed(payload, self._settings.dkim)
            _expect(conn.mail(sender, ["BODY=8BITMIME"] if eight_bit else []), 200, 299)
            stage = "rcpt"
            _expect(conn.rcpt(message.recipient), 200, 299)
            stage = "data"
            conn.putcmd("data")
            _expect(conn.getreply(), 354, 354)
            stage = "body"
            conn.send(_dot_stuffed(payload))
            stage = "final"
            reply = conn.getreply()
            if reply[0] // 100 not in (2, 4, 5):  # not a reply at all: acceptance unknown
                raise smtplib.SMTPResponseException(*reply)
            _expect(reply, 200, 299)
        except (RenderError, dkim.DKIMException) as e:  # nothing of this transaction has left
            # the same key fails every message: the breaker stops the run on the repeated code
            detail = render_failure_code(e) if isinstance(e, RenderError) else "smtp:dkim_error"
            outcome = SendOutcome.failed(FailureClass.PERMANENT, detail)
            return _logged(idempotency_key, "render", outcome, e.__cause__ or e)
        except _Stop as stop:
            if stop.code in (None, 421) or conn is None or not _replies_250(conn, "rset"):
                self._discard(conn)
            outcome = SendOutcome.failed(stop.failure_class, stop.detail)
            return _logged(idempotency_key, stage, outcome, stop.__cause__)
        except (smtplib.SMTPException, OSError) as e:
            self._discard(conn)
            return _logged(idempotency_key, stage, _error_outcome(e, stage), e)
        except BaseException:  # interrupted mid-transaction: later replies would be out of step
            self._discard(conn)
            raise
        ids = [value for name, value in message.headers if name.lower() == "message-id"]
        return SendOutcome.sent(ids[0] if ids else None)

    def close(self) -> None:
        """Ends every thread's connection (QUIT, then close); a later send reconnects."""
        with self._lock:
            conns, self._open = self._open, []
        for conn in conns:
            try:
                conn.quit()
            except (smtplib.SMTPException, OSError):
                conn.close()

    def _connection(self) -> smtplib.SMTP:
        conn: smtplib.SMTP | None = getattr(self._local, "conn", None)
        if conn is not None:
            with self._lock:
                live = any(c is conn for c in self._open)  # close() may have ended it
            if live and _replies_250(conn, "noop"):
                return conn
            self._discard(conn)
        conn = self._connect()
        self._local.conn = conn
        with self._lock:
            self._open.append(conn)
        return conn

    def _connect(self) -> smtplib.SMTP:
        s = self._settings
        tls = None if s.security == "none" else self._ssl_context or ssl.create_default_context()
        if s.security == "tls":
            conn: smtplib.SMTP = smtplib.SMTP_SSL(
                s.host, s.port, timeout=s.timeout_seconds, context=tls
            )
        else:
            conn = smtplib.SMTP(s.host, s.port, timeout=s.timeout_seconds)
        try:
            conn.ehlo_or_helo_if_needed()
            if s.security == "starttls":
                if not conn.has_extn("starttls"):  # never fall back to plain text
                    raise _Stop(FailureClass.PERMANENT, "smtp:starttls_unsupported")
                _expect(conn.starttls(context=tls), 220, 220)
                conn.ehlo_or_helo_if_needed()
            if s.username is not None:
                try:
                    conn.login(s.username, s.password or "")
                except (smtplib.SMTPResponseException, smtplib.SMTPServerDisconnected):
                    raise
                except smtplib.SMTPException as e:  # AUTH not offered, or no common mechanism
                    raise _Stop(FailureClass.PERMANENT, "smtp:auth_unsupported") from e
        except BaseException:
            conn.close()
            raise
        return conn

    def _discard(self, conn: smtplib.SMTP | None) -> None:
        if conn is None:
            return
        with self._lock:
            self._open = [c for c in self._open if c is not conn]
        self._local.conn = None
        with contextlib.suppress(OSError):
            conn.close()
