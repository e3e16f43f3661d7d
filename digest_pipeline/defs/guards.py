"""The refusals every step that starts a week's delivery asks for before it records anything.

A missed week (its window closed before any attempt) fails the step with the same one line
`digest run` prints, so a UI or schedule run of it is red with the reason, never a quiet green.
"""

import dagster as dg

from digest_pipeline.domain.errors import LateWeekRefused
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.ports import Clock, Ledger
from digest_pipeline.services import late


def refuse_missed_week(
    ledger: Ledger, policy: DeliveryPolicy, clock: Clock, period: Period
) -> None:
    """Raises `dg.Failure` (no step retry) with the refusal's line for a missed week."""
    try:
        late.require_deliverable(ledger, policy, period, clock.now())
    except LateWeekRefused as e:
        raise dg.Failure(description=str(e), allow_retries=False) from None
