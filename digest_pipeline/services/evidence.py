"""Ledger evidence of delivery: the first place reconciliation, replay and retries look."""

from digest_pipeline.domain.failures import FailureClass
from digest_pipeline.domain.model import Attempt
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.ports import Ledger

#: the audit actor of every automatic reconciliation
RECONCILE_ACTOR = "system:reconcile"


def confirmed_attempt(ledger: Ledger, key: OperationKey) -> Attempt | None:
    """The latest attempt the provider confirmed for the key, even one that lost its race."""
    confirmed = [a for a in ledger.attempts(key) if a.outcome == "sent"]
    return confirmed[-1] if confirmed else None


#: recorded outcomes the mailers give only when the provider did not take the message
NOT_ACCEPTED = frozenset(
    {FailureClass.TRANSIENT.value, FailureClass.THROTTLED.value, FailureClass.PERMANENT.value}
)


def never_accepted(ledger: Ledger, key: OperationKey) -> bool:
    """True when the key has attempts and every one closed with an outcome that proves not sent.

    An item can be `unknown` with such a history: its lease ran out mid-send, then the slow
    attempt came back with a transient failure. Nothing left, so it is due again.
    """
    history = ledger.attempts(key)
    return bool(history) and all(a.outcome in NOT_ACCEPTED for a in history)
