"""Ledger evidence of delivery: the first place reconciliation, replay and retries look."""

from digest_pipeline.domain import reconciliation
from digest_pipeline.domain.model import Attempt
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.ports.ledger_roles import ReadModel

#: the audit actor of every automatic reconciliation
RECONCILE_ACTOR = "system:reconcile"


def confirmed_attempt(ledger: ReadModel, key: OperationKey) -> Attempt | None:
    """The latest attempt the provider confirmed for the key, even one that lost its race."""
    return reconciliation.confirmed(ledger.attempts(key))
