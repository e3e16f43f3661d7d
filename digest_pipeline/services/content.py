"""Digest content: the generated product picks of every customer frozen for a period.

Generation is idempotent per customer: a customer who already has live rows, or whose digest
was already sent or cleaned, gets nothing new, so re-materialising a period never duplicates rows
and never resurrects the rows cleanup removed.
"""

import logging
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

from digest_pipeline.domain.catalogue import Order, PickPlan, digest_rows_for
from digest_pipeline.domain.errors import SnapshotMissing
from digest_pipeline.domain.model import DigestRow
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.ports import CustomerSource, Ledger
from digest_pipeline.services.logs import log_event

#: items whose rows are delivered (or already removed by cleanup): never generate for them again
_DONE = (DeliveryState.SENT, DeliveryState.CLEANED)


@dataclass(frozen=True)
class ContentReport:
    """What one content run did; `customers + skipped_existing` is the snapshot's size."""

    #: selected customers this run generated content for (including any who got no picks)
    customers: int
    #: digest rows written by this run
    rows: int
    #: selected customers left alone: they already had live rows, or were sent or cleaned
    skipped_existing: int
    #: customers for whom the catalogue offered nothing; their digests will fail to render
    without_picks: int = 0


def generate_content(
    source: CustomerSource,
    ledger: Ledger,
    period: Period,
    *,
    picks_per_customer: int = 4,
    lookback: timedelta = timedelta(weeks=12),
) -> ContentReport:
    """Stores the digest rows of every frozen customer of `period` who needs them.

    Picks come from the orders in `[period.ends_at - lookback, period.ends_at)`: they give both
    each customer's purchases and the popularity ranking. Safe to run again at any time.

    Raises:
        SnapshotMissing: the period's eligibility has not been frozen yet.
        ValueError: `picks_per_customer` is below 1 or `lookback` is not positive.
    """
    if picks_per_customer < 1:
        raise ValueError(f"picks_per_customer must be at least 1, got {picks_per_customer}")
    if lookback <= timedelta(0):
        raise ValueError(f"lookback must be positive, got {lookback}")
    if ledger.snapshot(period) is None:
        raise SnapshotMissing(f"period {period} has no frozen eligibility snapshot")
    entries = ledger.snapshot_entries(period)
    done = ledger.keys_with_rows(period) | {i.key for i in ledger.items(period, _DONE)}
    needed = [k for k in (OperationKey(period, e.customer_id) for e in entries) if k not in done]
    wanted = {k.customer_id for k in needed}

    products = {p.product_id: p for p in source.products()}
    popularity: Counter[str] = Counter()
    bought: defaultdict[str, list[Order]] = defaultdict(list)
    for order in source.orders(period.ends_at - lookback, period.ends_at):
        popularity[order.product_id] += 1
        if order.customer_id in wanted:
            bought[order.customer_id].append(order)

    empty: list[OperationKey] = []

    plan = PickPlan(products, popularity, period)

    def rows() -> Iterator[DigestRow]:
        for key in needed:
            picks = plan.picks(bought.get(key.customer_id, []), picks_per_customer)
            if not picks:
                empty.append(key)
            yield from digest_rows_for(key, picks)

    written = ledger.add_digest_rows(rows())
    report = ContentReport(len(needed), written, len(entries) - len(needed), len(empty))
    log_event(
        "content_generated",
        period=period,
        customers=report.customers,
        rows=report.rows,
        skipped_existing=report.skipped_existing,
        products=len(products),
        orders=popularity.total(),
    )
    if empty:
        log_event(
            "content_without_picks",
            logging.WARNING,
            period=period,
            customers=len(empty),
        )
    return report
