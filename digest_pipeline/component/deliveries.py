"""`digest_deliveries`: the delivery gate as a graph asset that fans out over batches of due items.

A plan step recovers expired leases and counts the period's due items, then yields one dynamic
output per batch (`batch_0000`, `batch_0001`, …: surrogate names, never a key or an address).
Each mapped step claims and delivers up to one batch with bounded concurrency; a customer's
failed send is a recorded state, so only an infrastructure fault, a week whose frozen snapshot
changed, or the circuit breaker (the provider failing every send the same way) fails a step. The collect step
reconciles `unknown` items and records the period's numbers, read back from the ledger.
"""

import math
from collections.abc import Iterator
from typing import Any

import dagster as dg

from digest_pipeline.component.guards import (
    changed_snapshot,
    first_refusal,
    link_settings,
    missed_week,
    nondurable_ledger,
    refuse_link_settings,
    refuse_nondurable_ledger,
    refuse_week,
    refused,
)
from digest_pipeline.component.report import NEEDING_A_LOOK, delivery_metadata, with_partitions_note
from digest_pipeline.component.spec import DigestSpec
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.runtime.helpers import deliver_in_processes
from digest_pipeline.services.metrics import period_metrics
from digest_pipeline.services.reconcile import reconcile_period
from digest_pipeline.wiring import build_deliverer


def build_deliveries(digest: DigestSpec) -> dg.AssetsDefinition:
    """The instance's `digest_deliveries`: plan, one step per batch, settle."""
    names = digest.names
    io_manager = names.named("io_manager")

    @dg.op(
        name=names.named("plan_batches"),
        ins={"work_items": dg.In(dg.Nothing)},
        # `before` is not yielded for a refused week: the steps after this one then skip
        out={
            "batches": dg.DynamicOut(int, io_manager_key=io_manager),
            "before": dg.Out(dict, is_required=False, io_manager_key=io_manager),
        },
        required_resource_keys=names.keys("ledger", "composer", "clock", "delivery"),
    )
    def plan_batches(
        context: dg.OpExecutionContext,
    ) -> Iterator[dg.Output[dict[str, int]] | dg.DynamicOutput[int]]:
        """Recovers expired leases, then yields one batch per `step_items` due items.

        A sensor's run starts here, so the week's refusals are asked again before anything is
        recorded; a refused week yields nothing (guards.py `refuse_week`).
        """
        r = names.resources(context.resources)
        ledger, composer, clock = r.ledger, r.composer, r.clock
        period = Period.parse(context.partition_key)
        settings = r.delivery.settings()
        line = first_refusal(
            missed_week(ledger, settings.policy, clock, period),
            changed_snapshot(ledger, clock, period),
            nondurable_ledger(ledger, settings.allow_nondurable_ledger),
            link_settings(ledger, composer, clock),
        )
        if line is not None:
            refuse_week(context, period, names.asset("digest_deliveries"), line)
            return
        now = clock.now()
        recovered = ledger.recover_expired_leases(now)
        counts = ledger.state_counts(period)
        due = ledger.due_count(now, period)
        batches = math.ceil(due / settings.step_items)
        context.log.info("period %s: %d due item(s) in %d batch(es)", period, due, batches)
        yield dg.Output(
            {
                "batches": batches,
                "skipped_already_sent": counts.get(DeliveryState.SENT, 0)
                + counts.get(DeliveryState.CLEANED, 0),
                "lease_requeued": len(recovered.requeued),
                "lease_unknown": len(recovered.unknown),
            },
            output_name="before",
        )
        for i in range(batches):
            yield dg.DynamicOutput(i, mapping_key=f"batch_{i:04d}", output_name="batches")

    @dg.op(
        name=names.named("deliver_batch"),
        out=dg.Out(dict, io_manager_key=io_manager),
        required_resource_keys=names.keys("ledger", "mailer", "composer", "clock", "delivery"),
    )
    def deliver_batch(context: dg.OpExecutionContext, batch: int) -> dict[str, int]:
        """Claims and delivers up to one batch of the period's due items; returns only counts."""
        r = names.resources(context.resources)
        ledger, composer, clock = r.ledger, r.composer, r.clock
        settings = r.delivery.settings()
        # first: a refused step records nothing, not even the secret's first fingerprint
        refuse_nondurable_ledger(ledger, settings.allow_nondurable_ledger)
        refuse_link_settings(ledger, composer, clock)
        deliverer = build_deliverer(
            ledger=ledger,
            mailer=r.mailer,
            composer=composer,
            clock=clock,
            policy=settings.policy,
            owner=f"{context.run.run_id[:8]}:{context.get_mapping_key()}",
        )
        with refused():
            report = deliver_in_processes(
                deliverer,
                settings.delivery_processes,
                batch_size=settings.claim_size,
                concurrency=settings.concurrency,
                period=Period.parse(context.partition_key),
                max_items=settings.step_items,
                breaker_threshold=settings.breaker_threshold,
            )
        return {"claimed": report.claimed, "lost_races": report.lost_races, **report.outcomes}

    @dg.op(
        name=names.named("settle_period"),
        out=dg.Out(io_manager_key=io_manager),
        required_resource_keys=names.keys("ledger", "mailer", "clock", "delivery"),
    )
    def settle_period(
        context: dg.OpExecutionContext, before: dict[str, int], results: list[dict[str, int]]
    ) -> dg.MaterializeResult[None]:
        """Reconciles the period's `unknown` items and records its numbers as asset metadata."""
        r = names.resources(context.resources)
        ledger, clock, period = r.ledger, r.clock, Period.parse(context.partition_key)
        policy = r.delivery.settings().policy
        reconciled = reconcile_period(ledger, r.mailer, clock, policy, period)
        metrics = period_metrics(ledger, period, clock.now())
        return dg.MaterializeResult(
            metadata=delivery_metadata(
                metrics, ledger.iter_items(period, NEEDING_A_LOOK), before, results, reconciled
            )
        )

    @dg.graph_asset(
        name="digest_deliveries",
        key_prefix=list(names.asset("digest_deliveries").path[:-1]),
        group_name=names.group,
        partitions_def=digest.partitions,
        ins={
            "digest_work_items": dg.AssetIn(
                key=names.asset("digest_work_items"), dagster_type=dg.Nothing
            )
        },
    )
    @with_partitions_note
    def digest_deliveries(digest_work_items: Any) -> Any:
        """Every work item of the week taken to a recorded state: sent, retrying, failed, or unknown.

        Fans out over batches of due items (`DIGEST_BATCH_SIZE`); a re-run sends nothing twice.
        Metadata is the week as the ledger holds it, as `digest status --json` names it: `delivered`
        (sent, or sent and cleaned) of `eligible`, as `delivered_fraction` (0..1, for the plot) and
        `delivered_pct` (text); a count for every state, adding up to `work_items`; the finished
        attempts by failure class (`<class>_attempts_fraction`, `<class>_attempts_pct`); per-item
        enqueue-to-claim delays; duplicates; feedback. What this run did is under `this_run_*`
        (`this_run_found_already_delivered` on a re-run). `worst_items` lists up to 20 items not
        sent, worst first, by key (no addresses, no content), or "none". Retries due later are
        picked up by the `digest_retry_sweeper` sensor.
        """
        batches, before = plan_batches(digest_work_items)
        return settle_period(before, batches.map(deliver_batch).collect())

    return digest_deliveries
