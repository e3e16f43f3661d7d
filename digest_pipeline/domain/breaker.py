"""The circuit breaker of one delivery run: a systemic provider failure stops the run, not the list.

A revoked API key (HTTP 401), refused SMTP credentials (535) or a payload the provider refuses for
everyone (422) fails every send the same way; going on item after item only turns the whole week
into failures. The breaker counts consecutive failed attempts with the same failure class and
detail code, never one about a single customer's address (a relay's 5.1.x, `invalid_recipient`);
at the threshold the worker stops claiming, and what it has not attempted stays due.
It also decides how many attempts may start, so that a failure present from the run's first send
spends at most `threshold` attempts (see `Breaker.room`).
"""

import re
from dataclasses import dataclass

from digest_pipeline.domain.failures import INVALID_RECIPIENT, FailureClass, SendOutcome

#: `DIGEST_BREAKER_THRESHOLD`'s default: above a relay's or provider's default 16 sends in flight,
#: so the breaker never holds a healthy worker back (the outbox's 64 start as 20 until a send of
#: the run succeeds), and far above what independent failures produce (20 same-code failures in
#: a row at a 20% failure rate: about 1e-14 per position).
DEFAULT_THRESHOLD = 20

#: Postmark's refusals of the server token or of the account's right to send: HTTP 401 and 403,
#: and API error codes 10 (bad or missing token), 400 and 401 (the sender signature is not
#: found, or not confirmed), 405 (not allowed to send: no credits left), 412 (the account is
#: pending) and 413 (the account may not send), however they come (adapters/mail/postmark.py)
POSTMARK_CREDENTIAL_REFUSALS = (
    "postmark:401",
    "postmark:403",
    *(f"postmark:422:{code}" for code in (10, 400, 401, 405, 412, 413)),
)
#: SendGrid's refusals of the API key: HTTP 401 and 403 (adapters/mail/sendgrid.py)
SENDGRID_CREDENTIAL_REFUSALS = ("sendgrid:401", "sendgrid:403")
#: Amazon SES's error codes that refuse the credentials or the account's right to send
#: (adapters/mail/ses.py): a request signed badly or by an unknown, expired or unauthorised key,
#: a paused or suspended account, an unverified MAIL FROM domain, a missing configuration set
SES_CREDENTIAL_CODES = frozenset(
    {
        "UnrecognizedClientException",
        "InvalidSignatureException",
        "SignatureDoesNotMatch",
        "IncompleteSignature",
        "IncompleteSignatureException",
        "MissingAuthenticationToken",
        "MissingAuthenticationTokenException",
        "AccessDenied",
        "AccessDeniedException",
        "ExpiredToken",
        "ExpiredTokenException",
        "InvalidClientTokenId",
        "SendingPausedException",
        "AccountSuspendedException",
        "MailFromDomainNotVerifiedException",
        "NotFoundException",
    }
)
#: as SES's mailer writes them (`ses:<Code>`), no credentials found at all, and a message refused
#: because the sender's own address is not a verified identity
SES_CREDENTIAL_REFUSALS = (
    *(f"ses:{c}" for c in sorted(SES_CREDENTIAL_CODES)),
    "ses:no_credentials",
    "ses:MessageRejected:sender_refused",
)
#: Reply codes that say the *sender's* credentials were refused (HTTP 401/403; RFC 4954 §6: SMTP
#: 530 authentication required, 535 credentials invalid): a configuration error, which the
#: customer did nothing to cause. Matched on the mailers' detail codes (`http:401:invalid_api_key`,
#: `smtp:535:5.7.8`, see adapters/http_mailer.py and smtp_mailer.py), which classify them
#: `permanent`.
CREDENTIAL_REFUSALS = (
    "http:401",
    "http:403",
    "smtp:530",
    "smtp:535",
    *POSTMARK_CREDENTIAL_REFUSALS,
    *SENDGRID_CREDENTIAL_REFUSALS,
    *SES_CREDENTIAL_REFUSALS,
)
#: RFC 3463 §3.2: enhanced status 5.1.x is "addressing status" (unknown user, bad mailbox, bad
#: destination domain): about that one recipient. A block of them (a stale import whose customer
#: ids sit together) is a dirty list, not a broken sender, and the provider did take our request.
#: Postmark's 406 "inactive recipient" (it bounced, complained or unsubscribed) is about that
#: one recipient in the same way.
_RECIPIENT_ADDRESSING = re.compile(r"smtp:5\d\d:5\.1\.\d{1,3}|postmark:422:406")


def recipient_addressing(outcome: SendOutcome) -> bool:
    """The relay refused this recipient's address (SMTP 5.1.x, Postmark 406), not our request."""
    return outcome.failure_class is not None and bool(
        _RECIPIENT_ADDRESSING.fullmatch(outcome.detail)
    )


def credentials_refused(outcome: SendOutcome) -> bool:
    """The provider refused our credentials, not the recipient or the message."""
    detail = outcome.detail
    return outcome.failure_class is not None and any(
        detail == code or detail.startswith(f"{code}:") for code in CREDENTIAL_REFUSALS
    )


def as_retryable(outcome: SendOutcome) -> SendOutcome:
    """A credential refusal becomes `transient`: retried once the sender is fixed, never `failed`.

    Any other outcome is returned unchanged. The detail code is kept, so the attempt still says
    what the provider answered.
    """
    if outcome.failure_class is FailureClass.PERMANENT and credentials_refused(outcome):
        return SendOutcome.failed(FailureClass.TRANSIENT, outcome.detail)
    return outcome


@dataclass
class Breaker:
    """Consecutive same-code failures of one worker's run; `threshold` None or 0 never opens."""

    threshold: int | None = DEFAULT_THRESHOLD
    #: (failure class, detail) of the current streak
    code: tuple[str, str] | None = None
    streak: int = 0
    #: a send of this run was accepted: the provider takes our messages
    proven: bool = False

    @property
    def enabled(self) -> bool:
        return self.threshold is not None and self.threshold > 0

    @property
    def open(self) -> bool:
        """The streak reached the threshold: stop claiming and starting attempts."""
        return self.enabled and self.streak >= (self.threshold or 0)

    def record(self, outcome: SendOutcome) -> None:
        """Counts one finished attempt, in the order the outcomes were recorded."""
        if outcome.failure_class is None:
            self.code, self.streak, self.proven = None, 0, True
            return
        if recipient_addressing(outcome):
            self.code, self.streak = None, 0  # the sender got through; the address did not
            return
        if outcome.detail == INVALID_RECIPIENT:
            # Refused before anything left, for that customer's address alone: it says nothing
            # of the provider either way, so a dirty list neither trips nor hides a streak.
            return
        code = (outcome.failure_class.value, outcome.detail)
        self.streak = self.streak + 1 if code == self.code else 1
        self.code = code

    def room(self, in_flight: int) -> int | None:
        """How many more attempts (or claims) may start now; None: no bound.

        Until a send of the run succeeds, and while a streak runs, at most `threshold - streak -
        in_flight`: even if every one of them fails like the streak, the streak stops at the
        threshold. So a failure present from the first send (a bad key) costs at most
        `threshold` attempts, and one that starts mid-run at most max(threshold, sends in
        flight); a healthy run is never held back.
        """
        if not self.enabled or (self.proven and self.streak == 0):
            return None
        return max(0, (self.threshold or 0) - self.streak - in_flight)

    def reason(self) -> str:
        """The one line a stopped run fails with: the streak, its class and code, a hint."""
        failure_class, detail = self.code or ("", "")
        if credentials_refused(SendOutcome.failed(FailureClass(failure_class), detail)):
            hint = (
                "the provider refused the sender's credentials (check DIGEST_PROVIDER_API_KEY, "
                "DIGEST_SMTP_USERNAME and DIGEST_SMTP_PASSWORD, or the AWS credentials and the SES "
                "account's sending status)"
            )
        else:
            hint = "the provider fails every send the same way"
        return (
            f"delivery stopped after {self.streak} consecutive {failure_class} failures with "
            f"{detail or 'no detail'}: {hint}; the items not attempted are left due"
        )
