"""Failure classes and the outcome of one attempt: what a mailer adapter reports to the core.

Adapters turn protocol replies and exceptions into a `SendOutcome`; the core decides from its
failure class alone, so no SMTP code or HTTP status leaks past the adapter.
"""

from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

from digest_pipeline.domain.errors import InvalidRecipient, RenderError

#: the detail of a digest refused before anything left for what many digests share (a product,
#: a template, a setting): the runbook's "a product broke the digests"
RENDER_ERROR = "render_error"
#: the detail of a digest refused before anything left because its recipient's address cannot
#: be addressed: about that one customer, so it never counts toward the breaker (breaker.py)
INVALID_RECIPIENT = "invalid_recipient"


class FailureClass(StrEnum):
    """Why an attempt did not end in a confirmed send (design §2)."""

    #: the request did not get through, and trying again later may work (421/45x, 5xx HTTP)
    TRANSIENT = "transient"
    #: the provider asked us to slow down (SMTP 452/454 throttling, HTTP 429)
    THROTTLED = "throttled"
    #: retrying cannot help (invalid/suppressed recipient, 55x, HTTP 4xx, render error)
    PERMANENT = "permanent"
    #: the request may have been accepted (timeout or drop after it was sent)
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class SendOutcome:
    """The result of one attempt. `detail` is a short code such as `smtp:451`, never content."""

    accepted: bool
    failure_class: FailureClass | None = None
    detail: str = ""
    provider_message_id: str | None = None
    #: the provider's own wait (Retry-After), honoured for throttled outcomes
    retry_after: timedelta | None = None
    #: the provider recognised the idempotency key and did not deliver again
    duplicate: bool = False
    #: the provider's account quota is spent: no send of the install can succeed until it
    #: resets, so every sender pauses (domain/pacing.py) and the customer is not at fault
    quota: bool = False

    def __post_init__(self) -> None:
        if self.accepted == (self.failure_class is not None):
            raise ValueError("an outcome is either accepted or has a failure class, not both")

    @classmethod
    def sent(cls, provider_message_id: str | None, *, duplicate: bool = False) -> "SendOutcome":
        return cls(True, None, "accepted", provider_message_id, duplicate=duplicate)

    @classmethod
    def failed(
        cls,
        failure_class: FailureClass,
        detail: str,
        *,
        retry_after: timedelta | None = None,
        quota: bool = False,
    ) -> "SendOutcome":
        return cls(False, failure_class, detail, None, retry_after, quota=quota)

    @property
    def label(self) -> str:
        """`sent` or the failure class value: the attempt's recorded outcome."""
        return "sent" if self.failure_class is None else self.failure_class.value


def render_failure_code(error: RenderError) -> str:
    """The detail code a permanent failure records for a render refusal.

    `invalid_recipient` for the recipient's address (`InvalidRecipient`), `render_error` for
    anything else; every mailer and the deliverer name a refusal through this one function.
    """
    return INVALID_RECIPIENT if isinstance(error, InvalidRecipient) else RENDER_ERROR
