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

from digest_pipeline.component.spec import DigestSpec
from digest_pipeline.dagster_private import UnresolvedAssetJobDefinition
from digest_pipeline.domain.states import CLAIMABLE, DeliveryState
from digest_pipeline.domain.transitions import sweep_reason

#: what a sweep run materialises: the week's delivery and cleanup
SWEEP_ASSETS = ("digest_deliveries", "digest_cleanup")
_OPEN = (*CLAIMABLE, DeliveryState.CLAIMED, DeliveryState.UNKNOWN)


def fingerprint(marks: Sequence[tuple[str, int, str]]) -> str:
    """A short, order-independent hash of (operation key, lease token, state) triples."""
    text = "\n".join(f"{k}|{t}|{s}" for k, t, s in sorted(marks))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_sensor(digest: DigestSpec, job: UnresolvedAssetJobDefinition) -> dg.SensorDefinition:
    """The instance's retry sweeper, requesting runs of its own job."""
    names = digest.names
    sweep_assets = [names.asset(a) for a in SWEEP_ASSETS]

    @dg.sensor(
        name=names.named("digest_retry_sweeper"),
        minimum_interval_seconds=300,
        default_status=dg.DefaultSensorStatus.STOPPED,
        # the job, not an asset selection: its runs are listed under the weekly job, not an
        # anonymous job of the sensor's own, and each request selects the job's last two assets
        job=job,
        required_resource_keys=names.keys("ledger", "clock", "delivery"),
    )
    def digest_retry_sweeper(
        context: dg.SensorEvaluationContext,
    ) -> dg.SensorResult | dg.SkipReason:
        """Requests a delivery + cleanup run for each week with work that is due now.

        Due work is a retry whose time has come, an `unknown` item, or a claim past its lease.
        The run key is the exact set of those items, so a batch is never run twice.
        """
        r = names.resources(context.resources)
        ledger, now = r.ledger, r.clock.now()
        retention = r.delivery.settings().policy.unknown_retention
        requests = []
        for period in ledger.open_periods():
            key = period.partition_key
            if not digest.partitions.has_partition_key(key):
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
                        asset_selection=sweep_assets,
                        tags={"digest/trigger": "sweep"},
                    )
                )
        if not requests:
            return dg.SkipReason("no open week has due retries, unknown items or expired claims")
        return dg.SensorResult(run_requests=requests)

    return digest_retry_sweeper
