"""The period's assets before and after delivery: snapshot, content, work items and cleanup.

Each asset reads its resources and calls one service. Its metadata is the week as the ledger
holds it, under `digest status --json`'s names, and what this run did under `this_run_*`
(counts only: no address, no digest content), so a re-run shows the same week. Every one is
safe to re-materialise: the services are idempotent.
"""

import dagster as dg

from digest_pipeline.component.asset_checks import CLEANUP_CHECKS, CONTENT_CHECKS, SNAPSHOT_CHECKS
from digest_pipeline.component.check_step import asset_with_checks
from digest_pipeline.component.guards import refuse_week, refused, week_refusal
from digest_pipeline.component.naming import Resources
from digest_pipeline.component.report import period_metadata, this_run
from digest_pipeline.component.spec import DigestSpec
from digest_pipeline.domain.periods import Period
from digest_pipeline.runtime.executor import executor_for
from digest_pipeline.services.cleanup import clean_period
from digest_pipeline.services.content import generate_content
from digest_pipeline.services.enqueue import enqueue_period
from digest_pipeline.services.metrics import cleanup_figures, content_totals
from digest_pipeline.services.snapshot import take_snapshot

#: every resource the snapshot's step reads, its checks' included
SNAPSHOT_NEEDS = ("customer_source", "ledger", "clock", "composer", "delivery")
#: excluded product ids listed in `digest_content`'s metadata (the count is always complete)
EXCLUDED_SHOWN = 100


def build_assets(digest: DigestSpec) -> list[dg.AssetsDefinition]:
    """The instance's snapshot, content, work items and cleanup assets, with their checks."""
    names = digest.names

    @asset_with_checks(
        digest, SNAPSHOT_CHECKS, needs=SNAPSHOT_NEEDS, deps=digest.upstream("customers")
    )
    def eligibility_snapshot(
        context: dg.AssetExecutionContext, r: Resources
    ) -> dg.MaterializeResult[None] | None:
        """The week's frozen selection of active, opted-in customers, with their addresses.

        Frozen by the first materialisation of the partition; a re-run reuses it unchanged
        (`this_run_froze` false), so a customer who opts out or in after the freeze does not change
        the week. Customers on the suppression list are left out (`this_run_suppressed_excluded`).
        A week that may not start (its window closed, a ledger that can lose commits, links or a
        footer its settings may not send) is refused: the run's `digest/refused` tag and an
        observation of this partition say why, and nothing of the week runs. A run tagged
        `digest/deliver_late` (the reason) and `digest/operator` grants a missed week a late window.
        """
        period, ledger, clock = Period.parse(context.partition_key), r.ledger, r.clock
        settings = r.delivery.settings()
        if (line := week_refusal(context, ledger, r.composer, clock, settings, period)) is not None:
            refuse_week(context, period, names.asset("eligibility_snapshot"), line)
            return None
        report = take_snapshot(
            r.customer_source,
            ledger,
            clock,
            period,
            context.run.run_id,
            executor=executor_for(ledger),
        )
        note = (
            f"Re-run: reused the snapshot frozen by run {report.selection_run_id}."
            if report.reused
            else "Froze a new snapshot."
        )
        return dg.MaterializeResult(
            metadata={
                **period_metadata(period),
                "eligible": report.eligible,
                "selected_at": dg.MetadataValue.timestamp(report.selected_at),
                "selection_run_id": dg.MetadataValue.text(report.selection_run_id),
                "note": dg.MetadataValue.text(note),
                "this_run_froze": not report.reused,
                # what the freeze read of the source: zeros on a run that reused the snapshot
                **this_run(
                    {
                        "considered": report.considered,
                        "invalid_ids": report.invalid_ids,
                        "suppressed_excluded": report.suppressed,
                    }
                ),
            }
        )

    @asset_with_checks(
        digest,
        CONTENT_CHECKS,
        needs=("customer_source", "ledger", "delivery"),
        deps=[names.asset("eligibility_snapshot"), *digest.upstream("products", "orders")],
    )
    def digest_content(
        context: dg.AssetExecutionContext, r: Resources
    ) -> dg.MaterializeResult[None]:
        """Each selected customer's generated digest rows (product picks), linked to its key.

        The week: `content_customers` have a digest written (or already sent), `content_missing`
        still need one. This run: customers who already had rows, or whose digest was already sent,
        are skipped (`this_run_skipped_existing`); `this_run_without_picks` counts customers the
        catalogue offered nothing; `this_run_picks_rule_failed` counts customers a shop's picks rule
        (`DIGEST_PICKS_RULE`) failed, whose digests fail at delivery (their keys are in the log).
        Catalogue products a digest cannot carry (a bad link, title, price) are left out of every
        pick: when there are any, `excluded_products` counts them and `excluded_product_ids` names
        each id with the fields that failed (the `catalogue_products_valid` check warns about them).
        """
        period, ledger = Period.parse(context.partition_key), r.ledger
        report = generate_content(
            r.customer_source,
            ledger,
            period,
            executor=executor_for(ledger),
            picks_rule=r.delivery.settings().picks_rule,
        )
        snapshot = ledger.snapshot(period)
        week = content_totals(ledger, period, snapshot.eligible_count if snapshot else 0)
        # only when there are some: a clean catalogue's metadata carries no exclusion entries
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
                **week,
                **this_run(
                    {
                        "customers": report.customers,
                        "rows": report.rows,
                        "skipped_existing": report.skipped_existing,
                        "without_picks": report.without_picks,
                        "picks_rule_failed": report.picks_rule_failed,
                    }
                ),
                **excluded,
            }
        )

    @asset_with_checks(digest, needs=("ledger", "clock"), deps=[names.asset("digest_content")])
    def digest_work_items(
        context: dg.AssetExecutionContext, r: Resources
    ) -> dg.MaterializeResult[None]:
        """One durable work item per selected customer, created once; `work_items` is the week's."""
        period, ledger = Period.parse(context.partition_key), r.ledger
        receipt = enqueue_period(ledger, r.clock, period)
        return dg.MaterializeResult(
            metadata={
                **period_metadata(period),
                "work_items": sum(ledger.state_counts(period).values()),
                **this_run({"created": receipt.created, "existing": receipt.existing}),
            }
        )

    @asset_with_checks(
        digest,
        CLEANUP_CHECKS,
        needs=("ledger", "clock", "delivery"),
        deps=[names.asset("digest_deliveries")],
    )
    def digest_cleanup(
        context: dg.AssetExecutionContext, r: Resources
    ) -> dg.MaterializeResult[None]:
        """The cleanup gate: archives or deletes the generated rows of sent digests, once per key.

        The week: `cleaned` items (their rows are gone), `sent` items whose rows are still held, and
        the cleanup lag from send to cleanup (`cleanup_lag_p50_s`, `cleanup_lag_max_s`). This run:
        items it cleaned and their rows; items not sent (`unknown`, `failed`, dead-lettered, still
        retrying) keep their rows and are counted in `this_run_held_back_<state>`.
        """
        period, ledger = Period.parse(context.partition_key), r.ledger
        mode = r.delivery.settings().cleanup_mode
        with refused():  # a changed snapshot: the step fails with its line, nothing is cleaned
            report = clean_period(ledger, r.clock, period, mode, executor=executor_for(ledger))
        held_back = {
            f"held_back_{reason.removeprefix('not_sent:')}": n
            for reason, n in sorted(report.held_back.items())
        }
        return dg.MaterializeResult(
            metadata={
                **period_metadata(period),
                **{k: v for k, v in cleanup_figures(ledger, period).items() if v is not None},
                **this_run(
                    {
                        "cleaned": report.cleaned,
                        "rows_cleaned": report.rows,
                        "found_cleaned": report.already_cleaned,
                        "lost_races": report.lost_races,
                        "held_back": report.held_back.total(),
                        **held_back,
                    }
                ),
            }
        )

    return [eligibility_snapshot, digest_content, digest_work_items, digest_cleanup]
