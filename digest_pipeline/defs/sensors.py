"""`digest_retry_sweeper`: requests `weekly_digest_job` runs of delivery and cleanup for due weeks.

A week has work when an item's retry is due, an item is `unknown` (reconciliation may settle it),
or a claim outlived its lease; the run key fingerprints exactly those items (operation key, lease
token, state), so one due batch gets one run however often the sensor ticks, and a changed batch a
new one. Items past their week's delivery window are dead-lettered by that run, never sent; the
sensor starts stopped and needs the daemon (`dagster dev` runs one).
"""

import hashlib
from collections.abc import Sequence

import dagster as dg

from digest_pipeline.defs.partitions import weekly_partitions
from digest_pipeline.defs.resources import DeliveryResource
from digest_pipeline.defs.schedules import weekly_digest_job
from digest_pipeline.domain.states import CLAIMABLE, DeliveryState
from digest_pipeline.domain.transitions import sweep_reason
from digest_pipeline.ports import Clock, Ledger

SWEEP_ASSETS = (dg.AssetKey("digest_deliveries"), dg.AssetKey("digest_cleanup"))
_OPEN = (*CLAIMABLE, DeliveryState.CLAIMED, DeliveryState.UNKNOWN)


def fingerprint(marks: Sequence[tuple[str, int, str]]) -> str:
    """A short, order-independent hash of (operation key, lease token, state) triples."""
    text = "\n".join(f"{k}|{t}|{s}" for k, t, s in sorted(marks))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dg.sensor(
    name="digest_retry_sweeper",
    minimum_interval_seconds=300,
    default_status=dg.DefaultSensorStatus.STOPPED,
    # the job, not an asset selection: its runs are listed under `weekly_digest_job`, not an
    # anonymous job of the sensor's own, and each request selects the job's last two assets
    job=weekly_digest_job,
)
def digest_retry_sweeper(
    context: dg.SensorEvaluationContext,
    ledger: dg.ResourceParam[Ledger],
    clock: dg.ResourceParam[Clock],
    delivery: DeliveryResource,
) -> dg.SensorResult | dg.SkipReason:
    """Requests a delivery + cleanup run for each week with work that is due now.

    Due work is a retry whose time has come, an `unknown` item, or a claim past its lease. The run
    key is the exact set of those items, so a batch is never run twice.
    """
    now = clock.now()
    retention = delivery.settings().policy.unknown_retention
    requests = []
    for period in ledger.open_periods():
        key = period.partition_key
        if not weekly_partitions.has_partition_key(key):
            context.log.info("period %s is not a partition of the weekly job; skipped", period)
            continue
        marks = [
            (str(i.key), i.lease_token, why)
            for i in ledger.items(period, _OPEN)
            if (why := sweep_reason(i, now, retention)) is not None
        ]
        if marks:
            requests.append(
                dg.RunRequest(
                    run_key=f"sweep:{period}:{fingerprint(marks)}",
                    partition_key=key,
                    asset_selection=list(SWEEP_ASSETS),
                    tags={"digest/trigger": "sweep"},
                )
            )
    if not requests:
        return dg.SkipReason("no open week has due retries, unknown items or expired claims")
    return dg.SensorResult(run_requests=requests)
