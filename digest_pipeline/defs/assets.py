"""The period's assets before and after delivery: snapshot, content, work items and cleanup.

Each asset reads its resources, calls one service and records the service's report as
materialisation metadata (counts only: no address, no digest content). Every one is safe to
re-materialise; the services are idempotent and the metadata says what a re-run reused.
"""

import dagster as dg

from digest_pipeline.defs.asset_checks import CLEANUP_CHECKS, CONTENT_CHECKS, SNAPSHOT_CHECKS
from digest_pipeline.defs.check_step import asset_with_checks
from digest_pipeline.defs.guards import refuse_missed_week, refuse_nondurable_ledger, refused
from digest_pipeline.defs.partitions import weekly_partitions
from digest_pipeline.defs.report import period_metadata, seconds
from digest_pipeline.defs.resources import DeliveryResource
from digest_pipeline.domain.periods import Period
from digest_pipeline.ports import Clock, CustomerSource, Ledger
from digest_pipeline.services.cleanup import clean_period
from digest_pipeline.services.content import generate_content
from digest_pipeline.services.enqueue import enqueue_period
from digest_pipeline.services.snapshot import take_snapshot

GROUP = "digest"
#: excluded product ids listed in `digest_content`'s metadata (the count is always complete)
EXCLUDED_SHOWN = 100


@asset_with_checks(SNAPSHOT_CHECKS, group=GROUP)
def eligibility_snapshot(
    context: dg.AssetExecutionContext,
    customer_source: dg.ResourceParam[CustomerSource],
    ledger: dg.ResourceParam[Ledger],
    clock: dg.ResourceParam[Clock],
    delivery: DeliveryResource,
) -> dg.MaterializeResult[None]:
    """The week's frozen selection of active, opted-in customers, with their addresses.

    Frozen by the first materialisation of the partition; a re-run reuses it unchanged (metadata
    `reused`), so a customer who opts out or in after the freeze does not change the week.
    Customers on the suppression list are left out (`suppressed_excluded`).

    Partitions are keyed by the ISO week's Monday (UTC): partition 2026-10-12 is period
    2026-W42; the metadata's `period` names the week.
    """
    period = Period.parse(context.partition_key)
    # a missed week is refused before anything is frozen (DIGEST_LATE_WINDOW_SECONDS)
    refuse_missed_week(ledger, delivery.settings().policy, clock, period)
    # and so is a ledger that can lose commits: the week's first step records nothing there
    refuse_nondurable_ledger(ledger, delivery.settings().allow_nondurable_ledger)
    report = take_snapshot(customer_source, ledger, clock, period, context.run.run_id)
    note = (
        f"Re-run: reused the snapshot frozen by run {report.selection_run_id}."
        if report.reused
        else "Froze a new snapshot."
    )
    return dg.MaterializeResult(
        metadata={
            **period_metadata(period),
            "eligible": report.eligible,
            "reused": report.reused,
            "note": dg.MetadataValue.text(note),
            "selected_at": dg.MetadataValue.timestamp(report.selected_at),
            "selection_run_id": dg.MetadataValue.text(report.selection_run_id),
            "considered": report.considered,
            "invalid_ids": report.invalid_ids,
            # customers on the suppression list the gate left out (0 on a re-run)
            "suppressed_excluded": report.suppressed,
        }
    )


@asset_with_checks(CONTENT_CHECKS, group=GROUP, deps=["eligibility_snapshot"])
def digest_content(
    context: dg.AssetExecutionContext,
    customer_source: dg.ResourceParam[CustomerSource],
    ledger: dg.ResourceParam[Ledger],
) -> dg.MaterializeResult[None]:
    """Each selected customer's generated digest rows (product picks), linked to its key.

    Customers who already have rows, or whose digest was already sent, are skipped
    (`skipped_existing`); `without_picks` counts customers the catalogue offered nothing.
    Catalogue products a digest cannot carry (a bad link, title, price) are left out of every
    pick: when there are any, `excluded_products` counts them and `excluded_product_ids` names
    each id with the fields that failed (the `catalogue_products_valid` check warns about them).

    Partitions are keyed by the ISO week's Monday (UTC): partition 2026-10-12 is period
    2026-W42; the metadata's `period` names the week.
    """
    period = Period.parse(context.partition_key)
    report = generate_content(customer_source, ledger, period)
    # only when there are some: a clean catalogue's metadata stays as it always was
    excluded: dict[str, int | dg.MetadataValue] = (
        {
            "excluded_products": len(report.excluded),
            "excluded_product_ids": dg.MetadataValue.json(
                {b.product_id: list(b.fields) for b in report.excluded[:EXCLUDED_SHOWN]}
            ),
        }
        if report.excluded
        else {}
    )
    return dg.MaterializeResult(
        metadata={
            **period_metadata(period),
            "customers": report.customers,
            "rows": report.rows,
            "skipped_existing": report.skipped_existing,
            "without_picks": report.without_picks,
            **excluded,
        }
    )


@dg.asset(group_name=GROUP, partitions_def=weekly_partitions, deps=[digest_content])
def digest_work_items(
    context: dg.AssetExecutionContext,
    ledger: dg.ResourceParam[Ledger],
    clock: dg.ResourceParam[Clock],
) -> dg.MaterializeResult[None]:
    """One durable work item per selected customer, created once (`existing` on a re-run).

    Partitions are keyed by the ISO week's Monday (UTC): partition 2026-10-12 is period
    2026-W42; the metadata's `period` names the week.
    """
    period = Period.parse(context.partition_key)
    receipt = enqueue_period(ledger, clock, period)
    return dg.MaterializeResult(
        metadata={
            **period_metadata(period),
            "created": receipt.created,
            "existing": receipt.existing,
        }
    )


@asset_with_checks(CLEANUP_CHECKS, group=GROUP, deps=["digest_deliveries"])
def digest_cleanup(
    context: dg.AssetExecutionContext,
    ledger: dg.ResourceParam[Ledger],
    clock: dg.ResourceParam[Clock],
    delivery: DeliveryResource,
) -> dg.MaterializeResult[None]:
    """The cleanup gate: archives or deletes the generated rows of sent digests, once per key.

    Items not sent (`unknown`, `failed`, dead-lettered, still retrying) keep their rows and are
    counted in `held_back_<state>`; a re-run counts earlier cleanups in `already_cleaned`.
    The cleanup lag (`cleanup_lag_p50_s`, `cleanup_lag_max_s`) runs from send to cleanup.

    Partitions are keyed by the ISO week's Monday (UTC): partition 2026-10-12 is period
    2026-W42; the metadata's `period` names the week.
    """
    period = Period.parse(context.partition_key)
    with refused():  # a changed snapshot: the step fails with its line, nothing is cleaned
        report = clean_period(ledger, clock, period, delivery.settings().cleanup_mode)
    # the cleanup lag is all it reports of the week's metrics: the rest are the deliveries'
    times = ledger.item_time_summary(period)
    held_back = {
        f"held_back_{reason.removeprefix('not_sent:')}": n
        for reason, n in sorted(report.held_back.items())
    }
    return dg.MaterializeResult(
        metadata={
            **period_metadata(period),
            "cleaned": report.cleaned,
            "already_cleaned": report.already_cleaned,
            "rows": report.rows,
            "held_back": report.held_back.total(),
            **held_back,
            "lost_races": report.lost_races,
            "cleanup_lag_p50_s": seconds(times.cleanup_lag_p50_s),
            "cleanup_lag_max_s": seconds(times.cleanup_lag_max_s),
        }
    )
