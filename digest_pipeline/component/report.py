"""Turns a week's numbers into asset metadata and check results the UI can show and plot.

Every materialisation and check evaluation names its ISO week (`period`, `2026-W42`). Metadata
holds the week as the ledger holds it, under `digest status --json`'s names, and what the run
did under `this_run_*`. Numbers stay plain ints and floats (one point per partition in the UI's
plots); a share is a plottable fraction *and* a text with its base (`3.1 % of 260 eligible`).
`worst_items` and check samples hold operation keys, states and failure codes, never an address
or digest content.
"""

import heapq
import inspect
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import dagster as dg

from digest_pipeline.domain.model import WorkItem
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.services.metrics import PeriodMetrics
from digest_pipeline.services.reconcile import ReconcileReport

F = TypeVar("F", bound=Callable[..., Any])

WORST_ITEMS = 20
#: operation keys an asset check lists as its sample
SAMPLE = 10
#: the sentence every asset and check description carries, for the analyst reading the UI
PARTITIONS_NOTE = (
    "Partitions are ISO weeks, keyed by the week's Monday as an ISO week date: partition "
    "2026-W42-1 is period 2026-W42 (type W42 in the partition filter)."
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
#: the key already names the customer; the failure is one column (`permanent: invalid_recipient`)
#: so a row fits on one line of the UI's metadata panel
_COLUMNS = ("key", "state", "attempts", "last_failure")
_TYPES = ("string", "string", "int", "string")


def with_partitions_note(fn: F) -> F:
    """`fn` with `PARTITIONS_NOTE` after its docstring, which Dagster shows as its description."""
    fn.__doc__ = f"{inspect.cleandoc(fn.__doc__ or '')}\n\n{PARTITIONS_NOTE}"
    return fn


def period_metadata(period: Period) -> dict[str, dg.MetadataValue]:
    """The `period` entry every materialisation and check evaluation starts with."""
    return {"period": dg.MetadataValue.text(str(period))}


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
                    "last_failure": last_failure(i),
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


def last_failure(item: WorkItem) -> str:
    """`class: detail` of the item's last failed attempt (`permanent: invalid_recipient`), or ``."""
    parts = [item.last_failure_class and item.last_failure_class.value, item.last_detail]
    return ": ".join(p for p in parts if p)


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


def week_metadata(metrics: PeriodMetrics) -> dict[str, Any]:
    """The week's figures as `digest status --json` prints them, as metadata values.

    The same names and roundings (`PeriodMetrics.as_flat_dict`); an absent figure (a share of
    nothing, a delay before any claim) is left out, since the UI cannot plot a null.
    """
    return {
        k: dg.MetadataValue.text(v) if isinstance(v, str) else v
        for k, v in metrics.as_flat_dict().items()
        if v is not None
    }


def this_run(counts: Mapping[str, int]) -> dict[str, int]:
    """`counts` as what this run did (`this_run_<name>`), apart from the week's totals."""
    return {f"this_run_{name}": n for name, n in counts.items()}


def delivery_metadata(
    metrics: PeriodMetrics,
    items: Iterable[WorkItem],
    before: Mapping[str, int],
    results: Sequence[Mapping[str, int]],
    reconciled: ReconcileReport,
) -> dict[str, Any]:
    """The metadata of one `digest_deliveries` materialisation.

    The week first, as the ledger holds it (`delivered` of `eligible`, a count for every state,
    the attempts by failure class, delays, duplicates, feedback), then what this run did under
    `this_run_*`, then `worst_items`. A re-run of a delivered week shows the week unchanged and
    zeros under `this_run_*`.
    """
    done: Counter[str] = Counter()
    for r in results:
        done.update(r)
    return {
        **week_metadata(metrics),
        **this_run(
            {
                "batches": before["batches"],
                "claimed": done["claimed"],
                "sent": done[DeliveryState.SENT.value],
                "lost_races": done["lost_races"],
                "found_already_delivered": before["skipped_already_sent"],
                "lease_requeued": before["lease_requeued"],
                "lease_unknown": before["lease_unknown"],
                "reconciled": reconciled.moved.total(),
            }
        ),
        # of the week's `unknown` items, those only another mailer's evidence (or `digest
        # resolve`) can settle
        "needs_other_mailer": reconciled.needs_mailer.total(),
        "worst_items": worst_items(items),
    }
