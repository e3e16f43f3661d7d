"""An operator adds a customer to the suppression list, or takes them off it; both audited.

`digest suppress` is for what the shop learns elsewhere (a support ticket, a legal request);
`digest unsuppress` undoes a mistaken suppression. A customer id that neither the shop's source
nor any snapshot knows is refused, so a typo cannot suppress nobody and report success.
"""

from dataclasses import dataclass

from digest_pipeline.domain.errors import DigestError
from digest_pipeline.domain.feedback import Suppression, SuppressionReason
from digest_pipeline.domain.periods import validate_customer_id
from digest_pipeline.ports.feedback import FeedbackStore
from digest_pipeline.ports.outside import Clock
from digest_pipeline.services.logs import step_log


class SuppressRefused(DigestError):
    """The request was refused as a whole; the list and the ledger are unchanged."""


@dataclass(frozen=True)
class SuppressReport:
    customer_id: str
    #: False when the customer was on the list already (suppress) or not on it (unsuppress)
    changed: bool
    #: the suppression that stands (the earlier one when `changed` is False), if any
    standing: Suppression | None


def _checked(store: FeedbackStore, customer_id: str, reason: str) -> str:
    validate_customer_id(customer_id)
    if not reason.strip():
        raise SuppressRefused("--reason must say why (it is recorded in the audit row)")
    if not store.known_customer(customer_id):
        raise SuppressRefused(f"no customer {customer_id} in the source or any snapshot")
    return customer_id


def _standing(store: FeedbackStore, customer_id: str) -> Suppression | None:
    return next((s for s in store.suppressions() if s.customer_id == customer_id), None)


def suppress_customer(
    store: FeedbackStore, clock: Clock, customer_id: str, reason: str, operator: str
) -> SuppressReport:
    """Suppresses the customer (reason `operator`, source `operator:<name>`), once."""
    _checked(store, customer_id, reason)
    suppression = Suppression(
        customer_id, SuppressionReason.OPERATOR, f"operator:{operator}", clock.now()
    )
    changed = store.suppress(suppression, reason)
    if changed:
        step_log.info("suppressed", customer_id=customer_id, reason="operator", operator=operator)
    return SuppressReport(customer_id, changed, _standing(store, customer_id))


def unsuppress_customer(
    store: FeedbackStore, clock: Clock, customer_id: str, reason: str, operator: str
) -> SuppressReport:
    """Takes the customer off the list; their later weeks select them again."""
    _checked(store, customer_id, reason)
    changed = store.unsuppress(customer_id, clock.now(), operator, reason)
    if changed:
        step_log.info("unsuppressed", customer_id=customer_id, operator=operator)
    return SuppressReport(customer_id, changed, _standing(store, customer_id))
