"""Operator resolution of one `unknown` item: declare it sent, or not sent (resend same key).

Only `unknown` items can be resolved; the move and the audit row (who and why) are written in
one transaction.
"""

from digest_pipeline.domain.errors import ResolveRefused, UnknownWorkItem
from digest_pipeline.domain.model import AuditNote, WorkItem
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.domain.transitions import resolved
from digest_pipeline.ports.outside import Clock
from digest_pipeline.services.combined_roles import WorkLedger
from digest_pipeline.services.logs import item_log


def resolve_unknown(
    ledger: WorkLedger, clock: Clock, key: OperationKey, *, sent: bool, reason: str, operator: str
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
    transition = resolved(item, sent, clock.now(), AuditNote(operator, "resolve", reason.strip()))
    ledger.apply(transition)
    target = transition.target
    item_log.info("resolved", key=key, state=target.value, operator=operator)
    updated = ledger.get(key)
    assert updated is not None
    return updated
