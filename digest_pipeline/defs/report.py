"""Turns a period's numbers into asset metadata and check results the UI can show and plot.

Every materialisation and check evaluation names its ISO week (`period`, `2026-W42`), because
the partition key the UI shows is that week's Monday (`2026-10-12`). Numbers stay plain ints and
floats (one point per partition in the UI's plots); a rate is kept as a plottable fraction in
[0, 1] *and* as a text that reads as a percentage of its base (`3.1 % of 260 eligible`).
`worst_items` and check samples hold operation keys (which name the customer id), states and
failure codes, never an address or digest content.
"""

import heapq
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import dagster as dg

from digest_pipeline.domain.failures import FailureClass
from digest_pipeline.domain.model import WorkItem
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.services.metrics import PeriodMetrics
from digest_pipeline.services.reconcile import ReconcileReport

WORST_ITEMS = 20
#: operation keys an asset check lists as its sample
SAMPLE = 10
#: the sentence every asset and check description carries, for the analyst reading the UI
PARTITIONS_NOTE = (
    "Partitions are keyed by the ISO week's Monday (UTC): partition 2026-10-12 is period "
    "2026-W42; the metadata's `period` names the week."
)
#: items that reached the provider: never listed in `worst_items`
DELIVERED = frozenset({DeliveryState.SENT, DeliveryState.CLEANED})
#: items nobody needs to look at: delivered, or deliberately not sent to a suppressed customer
SETTLED_AS_MEANT = DELIVERED | {DeliveryState.SUPPRESSED}
#: the states `worst_items` lists: what a caller reads for it (the ledger filters, not Python)
NEEDING_A_LOOK = tuple(s for s in DeliveryState if s not in SETTLED_AS_MEANT)
#: what `worst_items` says for a week with nothing left to look at
NONE_LEFT = "none: every item was sent (or sent and cleaned, or suppressed)"
#: most severe first: needs an operator, then dead ends, then still moving
_BY_SEVERITY = (
    DeliveryState.UNKNOWN,
    DeliveryState.DEAD_LETTERED,
    DeliveryState.FAILED,
    DeliveryState.CLAIMED,
    DeliveryState.RETRY_SCHEDULED,
    DeliveryState.PENDING,
)
SEVERITY = {s: rank for rank, s in enumerate(_BY_SEVERITY)}
#: the key already names the customer (`digest:2026-W42:customer-1842`): no separate column, so
#: the table fits beside the partition list
_COLUMNS = ("key", "state", "attempts", "last_failure_class", "last_detail")
_TYPES = ("string", "string", "int", "string", "string")
#: state counts that belong to the cleanup gate, shown on `digest_cleanup` only
_CLEANUP_STATES = frozenset({DeliveryState.CLEANED})


def period_metadata(period: Period) -> dict[str, dg.MetadataValue]:
    """The `period` entry every materialisation and check evaluation starts with."""
    return {"period": dg.MetadataValue.text(str(period))}


def fraction(part: int, whole: int) -> float | None:
    """`part / whole` rounded to 4 places (0.01 %), for plots; None when there is no base."""
    return round(part / whole, 4) if whole else None


def percent_of(part: int, whole: int, base: str) -> str:
    """`3.1 % of 260 eligible`: a share as a percentage with its denominator."""
    return rate_of(part / whole if whole else 0.0, whole, base)


def rate_of(rate: float, whole: int, base: str) -> str:
    """`rate` (a fraction of `whole`) as `3.1 % of 260 eligible`; `n/a (0 eligible)` for none."""
    if not whole:
        return f"n/a (0 {base})"
    return f"{100 * rate:.1f} % of {whole:,} {base}"


def seconds(value: float | None) -> float | None:
    """A duration in seconds rounded to 0.1 s: the UI prints floats in full."""
    return None if value is None else round(value, 1)


def worst_items(
    items: Iterable[WorkItem], limit: int = WORST_ITEMS
) -> dg.TableMetadataValue | dg.TextMetadataValue:
    """The `limit` worst items not sent, by (state severity, attempts desc, key).

    Sent, cleaned and suppressed items are left out; a week with nothing else says `NONE_LEFT` in
    text, because the UI draws an empty table as bare column headers. `items` may stream.
    """
    ranked = heapq.nsmallest(
        limit,
        (i for i in items if i.state not in SETTLED_AS_MEANT),
        key=lambda i: (SEVERITY[i.state], -i.attempts, str(i.key)),
    )
    if not ranked:
        return dg.MetadataValue.text(NONE_LEFT)
    return dg.MetadataValue.table(
        records=[
            dg.TableRecord(
                {
                    "key": str(i.key),
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
    **extra: float | str | dg.MetadataValue | None,
) -> dg.AssetCheckResult:
    """A check result for one week: its verdict, a one-line summary and a sample of keys.

    The description starts with the period (`2026-W42: …`) and the metadata with `period`, so
    the check reads the same whether the UI shows it by partition key or by run.
    """
    return dg.AssetCheckResult(
        passed=passed,
        severity=severity,
        description=f"{period}: {summary}",
        metadata={
            **period_metadata(period),
            "violations": violations,
            "sample": dg.MetadataValue.json(list(sample[:SAMPLE])),
            **extra,
        },
    )


def retry_rates(metrics: PeriodMetrics) -> dict[str, float | dg.MetadataValue]:
    """Per failure class: `retry_rate_<class>` (fraction) and `retry_rate_<class>_pct` (text).

    The base is the week's finished attempts (an attempt still open has no class yet).
    """
    entries: dict[str, float | dg.MetadataValue] = {}
    for fc in FailureClass:
        rate = metrics.retry_rate.get(fc.value, 0.0)
        entries[f"retry_rate_{fc.value}"] = round(rate, 4)
        entries[f"retry_rate_{fc.value}_pct"] = dg.MetadataValue.text(
            rate_of(rate, metrics.finished_attempts, "finished attempts")
        )
    return entries


def delivery_metadata(
    metrics: PeriodMetrics,
    items: Iterable[WorkItem],
    before: Mapping[str, int],
    results: Sequence[Mapping[str, int]],
    reconciled: ReconcileReport,
) -> dict[str, Any]:
    """The metadata of one `digest_deliveries` materialisation.

    The headline first (`delivered` of `eligible`), then the counts by state, rates, delays and
    this run's own numbers. Cleanup's numbers (`cleaned`, the cleanup lag) are on
    `digest_cleanup`; `delivered` counts a sent-then-cleaned item as delivered.
    """
    this_run: Counter[str] = Counter()
    for r in results:
        this_run.update(r)
    return {
        **period_metadata(metrics.period),
        "eligible": metrics.eligible,
        "delivered": metrics.delivered,
        "delivered_fraction": fraction(metrics.delivered, metrics.eligible),
        "delivered_pct": dg.MetadataValue.text(
            percent_of(metrics.delivered, metrics.eligible, "eligible")
        ),
        **{
            s.value: metrics.by_state.get(s.value, 0)
            for s in DeliveryState
            if s not in _CLEANUP_STATES
        },
        "attempts": metrics.attempts,
        **retry_rates(metrics),
        "enqueue_to_claim_p50_s": seconds(metrics.enqueue_to_claim_p50_s),
        "enqueue_to_claim_p95_s": seconds(metrics.enqueue_to_claim_p95_s),
        "oldest_pending_age_s": seconds(metrics.oldest_pending_age_s),
        "duplicates_suppressed": metrics.duplicates_suppressed,
        "duplicate_sends": metrics.duplicate_sends,
        "dead_lettered_rows": sum(metrics.dead_letters.values()),
        # what customers and the provider said (digest serve); `suppressed` above is the items
        # cancelled because their customer was suppressed after the snapshot froze
        "unsubscribes": metrics.feedback.unsubscribes,
        "hard_bounces": metrics.feedback.hard_bounces,
        "complaints": metrics.feedback.complaints,
        "complaint_rate": metrics.complaint_rate,
        "batches": before["batches"],
        "claimed_this_run": this_run["claimed"],
        "sent_this_run": this_run[DeliveryState.SENT.value],
        "lost_races": this_run["lost_races"],
        "skipped_already_sent": before["skipped_already_sent"],
        "lease_requeued": before["lease_requeued"],
        "lease_unknown": before["lease_unknown"],
        "reconciled": reconciled.moved.total(),
        "still_unknown": reconciled.still_unknown,
        # unknown items only another mailer's evidence (or `digest resolve`) can settle
        "needs_other_mailer": reconciled.needs_mailer.total(),
        "worst_items": worst_items(items),
    }
