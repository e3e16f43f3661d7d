"""Send outcomes the delivery tests script, and a reader of the dead letters they leave."""

from datetime import timedelta

from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.ports.ledger_roles import ReadModel
from digest_pipeline_tests.conftest import W42

TRANSIENT = SendOutcome.failed(FailureClass.TRANSIENT, "smtp:421")
PERMANENT = SendOutcome.failed(FailureClass.PERMANENT, "smtp:550")


def throttled(retry_after: timedelta | None) -> SendOutcome:
    """A provider's 429, with its Retry-After when given."""
    return SendOutcome.failed(FailureClass.THROTTLED, "http:429", retry_after=retry_after)


def dead_letter_reasons(ledger: ReadModel) -> dict[str, str]:
    """The week's dead letters: reason by operation key."""
    return {str(d.key): d.reason for d in ledger.dead_letters(W42)}
