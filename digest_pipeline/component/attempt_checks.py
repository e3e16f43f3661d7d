"""`every_due_item_attempted`: a week whose delivery step ended with items never tried is red.

After `digest_deliveries` every item must have been claimed at least once: a `pending` item left
behind means a delivery batch never ran (an executor that dropped the fan-out, a step skipped),
and a run that did not attempt its eligible items must not look green. ERROR and blocking, so
cleanup of that run waits too; the next run or sweep picks the items up.
"""

import dagster as dg

from digest_pipeline.component.check_step import CheckInputs, check
from digest_pipeline.component.report import check_result
from digest_pipeline.domain.states import DeliveryState


@check("digest_deliveries", "ledger", blocking=True)
def every_due_item_attempted(inputs: CheckInputs) -> dg.AssetCheckResult:
    """Fails when items of the week are still `pending` after its delivery step finished.

    Every due item is claimed by one of the delivery batches; one never attempted means a batch
    did not run.
    """
    period = inputs.period
    left = inputs.ledger.items(period, (DeliveryState.PENDING,))
    return check_result(
        period,
        not left,
        len(left),
        [str(i.key) for i in left],
        "every item was attempted"
        if not left
        else f"{len(left)} item(s) never attempted by the delivery step",
    )
