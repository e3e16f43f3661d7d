"""Turns a period's numbers into asset metadata and check results the UI can show and plot.

Numbers stay plain ints and floats (one point per partition in the UI's plots); `worst_items`
and check samples hold operation keys, customer ids, states and failure codes, never an
address or digest content.
"""

import heapq
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import dagster as dg

from digest_pipeline.domain.model import WorkItem
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.services.metrics import PeriodMetrics
from digest_pipeline.services.reconcile import ReconcileReport

S = DeliveryState
WORST_ITEMS = 20
#: operation keys an asset check lists as its sample
SAMPLE = 10
#: most severe first: needs an operator, then dead ends, then still moving, then done
_BY_SEVERITY = (S.UNKNOWN, S.DEAD_LETTERED, S.FAILED, S.CLAIMED, S.RETRY_SCHEDULED, S.PENDING)
SEVERITY = {s: rank for rank, s in enumerate((*_BY_SEVERITY, S.SENT, S.CLEANED))}
_COLUMNS = ("key", "customer_id", "state", "attempts", "last_failure_class", "last_detail")
_TYPES = ("string", "string", "string", "int", "string", "string")


def worst_items(items: Iterable[WorkItem], limit: int = WORST_ITEMS) -> dg.TableMetadataValue:
    """The `limit` worst items by (state severity, attempts desc, key); `items` may stream."""
    ranked = heapq.nsmallest(
        limit, items, key=lambda i: (SEVERITY[i.state], -i.attempts, str(i.key))
    )
    return dg.MetadataValue.table(
        records=[
            dg.TableRecord(
                {
                    "key": str(i.key),
                    "customer_id": i.customer_id,
                    "state": i.state.value,
                    "attempts": i.attempts,
                    "last_failure_class": i.last_failure_class and i.last_failure_class.value,
                    "last_detail": i.last_detail,
                }
            )
            for i in ranked
        ],
        schema=dg.TableSchema(
            columns=[
                dg.TableColumn(name, kind) for name, kind in zip(_COLUMNS, _TYPES, strict=True)
            ]
        ),
    )


def check_result(
    period: Period,
    passed: bool,
    violations: int,
    sample: Sequence[str],
    summary: str,
    severity: dg.AssetCheckSeverity = dg.AssetCheckSeverity.ERROR,
    **extra: float | None,
) -> dg.AssetCheckResult:
    """A check result for one week: its verdict, a one-line summary and a sample of keys."""
    return dg.AssetCheckResult(
        passed=passed,
        severity=severity,
        description=f"{period}: {summary}",
        metadata={
            "violations": violations,
            "sample": dg.MetadataValue.json(list(sample[:SAMPLE])),
            **extra,
        },
    )


def delivery_metadata(
    metrics: PeriodMetrics,
    items: Iterable[WorkItem],
    before: Mapping[str, int],
    results: Sequence[Mapping[str, int]],
    reconciled: ReconcileReport,
) -> dict[str, Any]:
    """The metadata of one `digest_deliveries` materialisation."""
    this_run: Counter[str] = Counter()
    for r in results:
        this_run.update(r)
    flat = {k: v for k, v in metrics.as_flat_dict().items() if k != "period"}
    return {
        "period": dg.MetadataValue.text(str(metrics.period)),
        **flat,
        "batches": before["batches"],
        "claimed_this_run": this_run["claimed"],
        "sent_this_run": this_run[S.SENT.value],
        "lost_races": this_run["lost_races"],
        "skipped_already_sent": before["skipped_already_sent"],
        "lease_requeued": before["lease_requeued"],
        "lease_unknown": before["lease_unknown"],
        "reconciled": reconciled.moved.total(),
        "still_unknown": reconciled.still_unknown,
        "worst_items": worst_items(items),
    }
