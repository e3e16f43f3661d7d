"""Operator resolution of one `unknown` item: declare it sent, or not sent (resend same key).

Only `unknown` items can be resolved; the move and the audit row (who and why) are written in
one transaction.
"""

from digest_pipeline.domain.errors import ResolveRefused, UnknownWorkItem
from digest_pipeline.domain.model import AuditNote, ClearDedupe, Transition, WorkItem
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.ports import Clock, Ledger
from digest_pipeline.services.logs import log_event


def resolve_unknown(
    ledger: Ledger, clock: Clock, key: OperationKey, *, sent: bool, reason: str, operator: str
) -> WorkItem:
    """Moves an `unknown` item to `sent` or back to `retry_scheduled` (due now); audited."""
    if not reason.strip():
        raise ResolveRefused("a resolution needs a reason")
    operator = operator.strip()
    if not operator:
        raise ResolveRefused("a resolution needs an operator")
    item = ledger.get(key)
    if item is None:
        raise UnknownWorkItem(f"no work item for {key}")
    if item.state is not DeliveryState.UNKNOWN:
        raise ResolveRefused(f"{key} is {item.state.value}; only unknown items can be resolved")
    now = clock.now()
    target = DeliveryState.SENT if sent else DeliveryState.RETRY_SCHEDULED
    ledger.apply(
        Transition(
            key,
            DeliveryState.UNKNOWN,
            item.lease_token,
            target,
            now,
            next_attempt_at=None if sent else now,
            detail="resolved_sent" if sent else "resolved_not_sent",
            # the operator's word is the evidence: the resend needs no deduplication
            effects=() if sent else (ClearDedupe(),),
            audit=AuditNote(operator, "resolve", reason.strip()),
        )
    )
    log_event("resolved", key=key, state=target.value, operator=operator)
    updated = ledger.get(key)
    assert updated is not None
    return updated
