"""Three warnings for operators on `digest_deliveries`: stale items, dead letters, complaints.

WARN severity: they never block cleanup; they tell an operator to look (is the sweeper running?
is a provider refusing a whole domain? are customers marking the digest as spam?). The first two
thresholds are `DeliveryResource` configuration; the complaint rate is the mailbox providers'.
"""

from datetime import timedelta

import dagster as dg

from digest_pipeline.component.check_step import CheckInputs, check
from digest_pipeline.component.report import DELIVERED, check_result
from digest_pipeline.domain.feedback import COMPLAINT_RATE_LIMIT
from digest_pipeline.domain.states import CLAIMABLE, DeliveryState
from digest_pipeline.services.metrics import percent_of, seconds

_WAITING = (*CLAIMABLE, DeliveryState.CLAIMED)


@check("digest_deliveries", "ledger", "clock", "delivery")
def stale_items(inputs: CheckInputs) -> dg.AssetCheckResult:
    """Warns when a waiting item of the week is older than the stale threshold.

    Waiting means pending, retrying or claimed; the threshold is `stale_after_seconds` (6 h by
    default). Old waiting items usually mean the `digest_retry_sweeper` sensor is not running.
    """
    period, now = inputs.period, inputs.clock.now()
    limit = timedelta(seconds=inputs.delivery.settings().stale_after_seconds)
    waiting = inputs.ledger.items(period, _WAITING)
    stale = sorted((i for i in waiting if now - i.created_at > limit), key=lambda i: i.created_at)
    oldest = max((now - i.created_at).total_seconds() for i in waiting) if waiting else None
    return check_result(
        period,
        not stale,
        len(stale),
        [str(i.key) for i in stale],
        f"{len(stale)} item(s) waiting longer than {limit}",
        dg.AssetCheckSeverity.WARN,
        oldest_pending_age_s=seconds(oldest),
        threshold_s=limit.total_seconds(),
    )


@check("digest_deliveries", "ledger", "delivery")
def dead_letter_volume(inputs: CheckInputs) -> dg.AssetCheckResult:
    """Warns when too many of the week's digests ended dead-lettered or failed.

    The share is (dead-lettered + failed) / eligible, against `dead_letter_rate_threshold` (5 % by
    default): metadata `dead_letter_rate` (a fraction, 0..1) and `dead_letter_rate_pct` (text, in
    percent of eligible). Inspect them with `digest dead-letters --period …` before replaying any.
    """
    period, ledger = inputs.period, inputs.ledger
    threshold = inputs.delivery.settings().dead_letter_rate_threshold
    snapshot = ledger.snapshot(period)
    eligible = snapshot.eligible_count if snapshot is not None else 0
    lost = ledger.items(period, (DeliveryState.DEAD_LETTERED, DeliveryState.FAILED))
    rate = len(lost) / eligible if eligible else 0.0
    share = percent_of(len(lost), eligible, "eligible")
    verdict = f"{'within' if rate <= threshold else 'above'} the {100 * threshold:.1f} % threshold"
    within = rate <= threshold
    # violations count only when the share is above the threshold: a passing check shows 0
    return check_result(
        period,
        within,
        0 if within else len(lost),
        [] if within else [str(i.key) for i in lost],
        f"{len(lost)} item(s) dead-lettered or failed: {share} ({verdict})",
        dg.AssetCheckSeverity.WARN,
        eligible=eligible,
        dead_lettered_or_failed=len(lost),
        dead_letter_rate=round(rate, 4),
        dead_letter_rate_pct=dg.MetadataValue.text(f"{share}, {verdict}"),
        threshold=threshold,
    )


@check("digest_deliveries", "ledger")
def complaint_rate(inputs: CheckInputs) -> dg.AssetCheckResult:
    """Warns when spam complaints about the week's digests exceed 0.3 % of those delivered.

    Complaints are the provider's `complained` events matched to the week's items (`digest
    serve`); delivered is sent plus cleaned. 0.3 % is the rate Gmail and Yahoo hold bulk senders
    to; above it, mail starts going to spam for everyone. Metadata `complaint_rate` (fraction)
    and `complaint_rate_pct` (text), with the week's hard bounces and unsubscribes beside them.
    Complaints keep arriving for days: the check reads the ledger as it is when it runs (each
    sweep and re-run of the week evaluates it again).
    """
    period, ledger = inputs.period, inputs.ledger
    counts = ledger.feedback_counts(period)
    delivered = sum(n for s, n in ledger.state_counts(period).items() if s in DELIVERED)
    rate = counts.complaints / delivered if delivered else 0.0
    share = percent_of(counts.complaints, delivered, "delivered")
    limit = COMPLAINT_RATE_LIMIT
    verdict = f"{'within' if rate <= limit else 'above'} the {100 * limit:.1f} % limit"
    return check_result(
        period,
        rate <= limit,
        counts.complaints if rate > limit else 0,
        [],
        f"{counts.complaints} complaint(s): {share} ({verdict})",
        dg.AssetCheckSeverity.WARN,
        delivered=delivered,
        complaints=counts.complaints,
        hard_bounces=counts.hard_bounces,
        unsubscribes=counts.unsubscribes,
        complaint_rate=round(rate, 4),
        complaint_rate_pct=dg.MetadataValue.text(f"{share}, {verdict}"),
        limit=limit,
    )
