"""One durable work item per selected customer, created idempotently from the frozen snapshot."""

from digest_pipeline.domain.model import EnqueueReceipt
from digest_pipeline.domain.periods import Period
from digest_pipeline.ports.ledger_roles import WorkQueue
from digest_pipeline.ports.outside import Clock
from digest_pipeline.services.logs import step_log


def enqueue_period(ledger: WorkQueue, clock: Clock, period: Period) -> EnqueueReceipt:
    """Creates the missing items of the period; existing ones are left as they are."""
    receipt = ledger.enqueue(period, clock.now())
    step_log.info("enqueued", period=period, created=receipt.created, existing=receipt.existing)
    return receipt
