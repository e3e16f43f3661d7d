"""Digest content: the generated product picks of every customer frozen for a period.

Generation is idempotent per customer: a customer who already has live rows, or whose digest
was already sent or cleaned, gets nothing new, so re-materialising a period never duplicates rows
and never resurrects the rows cleanup removed.

Memory stays flat in the number of customers (a million-customer period runs in the same few
tens of megabytes as a thousand): only the popularity ranking needs every order in the window,
and it is a count per product. Everything per customer (the frozen selection, what is already
done, the orders bought, the rows written) is read and written a chunk of customers at a time.
Each chunk is its own write, so a run that stops half way leaves whole customers with rows, and
the next run, skipping them, finishes the rest.

A catalogue product that cannot become a safe message (a quote in its image link, a title with
a line break, a price below zero) is left out of every pick and reported by id with the field
that failed, so one bad row costs that product its place, never a customer their digest.

The picks come from a rule (`catalogue.PicksRule`; the shop's own through `DIGEST_PICKS_RULE`).
A rule that raises or answers with anything but picks of the week's catalogue costs that one
customer their rows, never the week: the customer is logged by operation key with the reason
(`picks_rule_failed`), counted in the report, and, holding no rows, fails at delivery as a
permanent `render_error` ("no digest rows") as a customer without picks does. A later run of
content generation asks the rule again for every customer still without rows.
"""

import traceback
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Protocol

from digest_pipeline.domain.catalogue import (
    Order,
    PickPlan,
    PickRequest,
    PicksRejected,
    PicksRule,
    Product,
    ProductProblem,
    checked_picks,
    digest_rows_for,
    popular_in_your_categories,
)
from digest_pipeline.domain.chunks import chunked
from digest_pipeline.domain.errors import SnapshotMissing
from digest_pipeline.domain.model import DigestRow
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.ports.ledger_roles import ContentBacklog, ContentStore, SnapshotStore
from digest_pipeline.ports.outside import CustomerSource
from digest_pipeline.services.executor import IN_TURN, Executor
from digest_pipeline.services.logs import item_log, step_log


class ContentLedger(SnapshotStore, ContentStore, ContentBacklog, Protocol):
    """The frozen selection, who of it still needs rows, and the rows written for them."""


#: customers per chunk: large enough that per-chunk queries are few, small enough that a chunk's
#: orders and rows (a few megabytes) do not show in the process's peak
CHUNK = 5_000
#: how far back orders count, for purchases and popularity
LOOKBACK = timedelta(weeks=12)
#: excluded product ids named in the warning line (the count is always complete)
EXCLUDED_LOGGED = 20
#: operation keys of customers the picks rule failed, kept in the report and the step's line
RULE_FAILED_KEPT = 20
#: chunks being written while the next is picked, over a database server
WRITES_IN_FLIGHT = 1


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
    #: catalogue products left out of every pick, by id with the fields that failed
    excluded: tuple[ProductProblem, ...] = ()
    #: customers the picks rule failed (raised or answered junk): no rows, each logged by key
    picks_rule_failed: int = 0
    #: the first `RULE_FAILED_KEPT` of them, in the order they were picked
    picks_rule_failed_sample: tuple[OperationKey, ...] = ()


@dataclass(frozen=True)
class ChunkContent:
    """One chunk's rows, and its customers who got none."""

    rows: list[DigestRow]
    #: customers the rule answered with no picks
    without_picks: int
    #: customers the rule failed for (`picks_rule_failed` lines)
    rule_failed: list[OperationKey]


@dataclass(frozen=True)
class ContentPlan:
    """A period's picking, prepared once: the screened, ranked catalogue and the order window."""

    plan: PickPlan
    since: datetime
    until: datetime
    products: int
    orders: int
    rule: PicksRule = popular_in_your_categories

    @property
    def excluded(self) -> tuple[ProductProblem, ...]:
        """The catalogue's bad products, by id (`catalogue.product_problems`)."""
        return self.plan.excluded

    @property
    def rule_name(self) -> str:
        """`module:function` of the rule, as `DIGEST_PICKS_RULE` names it."""
        module = getattr(self.rule, "__module__", "?")
        return f"{module}:{getattr(self.rule, '__qualname__', type(self.rule).__name__)}"

    def rows_for(
        self, source: CustomerSource, keys: Sequence[OperationKey], picks_per_customer: int
    ) -> tuple[list[DigestRow], int]:
        """The rows of `keys` (one chunk of customers) and how many of them got no picks.

        The count includes the customers the rule failed (`content_of` tells them apart).
        """
        chunk = self.content_of(source, keys, picks_per_customer)
        return chunk.rows, chunk.without_picks + len(chunk.rule_failed)

    def content_of(
        self, source: CustomerSource, keys: Sequence[OperationKey], picks_per_customer: int
    ) -> ChunkContent:
        """The rows of `keys` (one chunk of customers), and who of them got none and why."""
        bought: defaultdict[str, list[Order]] = defaultdict(list)
        for order in source.orders_of([k.customer_id for k in keys], self.since, self.until):
            bought[order.customer_id].append(order)
        rows: list[DigestRow] = []
        empty = 0
        failed: list[OperationKey] = []
        for key in keys:
            picks = self._picks(key, bought.get(key.customer_id, ()), picks_per_customer)
            if picks is None:
                failed.append(key)
                continue
            empty += not picks
            rows.extend(digest_rows_for(key, picks, self.plan.payloads))
        return ChunkContent(rows, empty, failed)

    def _picks(
        self, key: OperationKey, bought: Sequence[Order], limit: int
    ) -> list[Product] | None:
        """The rule's checked picks for one customer, or None (logged by key) if it failed."""
        request = PickRequest(key, tuple(bought), limit, self.plan)
        try:
            answer = self.rule(request)
        except Exception as e:
            # The rule is the shop's code: whatever it raises costs this customer their digest,
            # never the week. Only the exception's class and where it was raised are logged:
            # its text is the rule's and may quote a product or a customer.
            why = f"raised {type(e).__name__}{_raised_at(e)}"
        else:
            try:
                return checked_picks(request, answer)
            except PicksRejected as e:
                why = str(e)
        item_log.warning("picks_rule_failed", key=key, why=why)
        return None


def _raised_at(error: BaseException) -> str:
    """` at rules.py:12`: the file and line the error was raised at, or nothing.

    The first frame is the call in `_picks`; a rule with no Python frame of its own (a builtin)
    is named by nothing rather than by this module.
    """
    frames = traceback.extract_tb(error.__traceback__)[1:]
    if not frames:
        return ""
    return f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}"


def plan_content(
    source: CustomerSource,
    period: Period,
    lookback: timedelta = LOOKBACK,
    picks_rule: PicksRule = popular_in_your_categories,
) -> ContentPlan:
    """Reads the catalogue and the window's popularity once and prepares the period's picks.

    Orders in `[period.ends_at - lookback, period.ends_at)` give both each customer's purchases
    and the popularity ranking; bad products are screened out here and logged by id.
    `picks_rule` then picks for each customer (`ContentPlan.content_of`).

    Raises:
        ValueError: `lookback` is not positive.
    """
    if lookback <= timedelta(0):
        raise ValueError(f"lookback must be positive, got {lookback}")
    since, until = period.ends_at - lookback, period.ends_at
    products = {p.product_id: p for p in source.products()}
    popularity = source.popularity(since, until)
    plan = PickPlan(products, popularity, period)
    if plan.excluded:
        step_log.warning(
            "catalogue_products_excluded",
            period=period,
            products=len(plan.excluded),
            product_ids=",".join(b.product_id for b in plan.excluded[:EXCLUDED_LOGGED]),
        )
    return ContentPlan(plan, since, until, len(products), popularity.total(), picks_rule)


def generate_content(
    source: CustomerSource,
    ledger: ContentLedger,
    period: Period,
    *,
    picks_per_customer: int = 4,
    lookback: timedelta = LOOKBACK,
    chunk: int = CHUNK,
    executor: Executor = IN_TURN,
    picks_rule: PicksRule = popular_in_your_categories,
) -> ContentReport:
    """Stores the digest rows of every frozen customer of `period` who needs them.

    Picks come from the orders in `[period.ends_at - lookback, period.ends_at)`: they give both
    each customer's purchases and the popularity ranking. Products that cannot make a safe
    message are never picked and are reported by id (`excluded`). Safe to run again at any time.
    `chunk` customers are read, picked and written together: it bounds memory, never the result.
    `picks_rule` picks (the settings' `shop.picks_rule`); a customer it fails gets no rows
    (`picks_rule_failed`) and is asked for again by the next run.

    Raises:
        SnapshotMissing: the period's eligibility has not been frozen yet.
        ValueError: `picks_per_customer` or `chunk` is below 1 or `lookback` is not positive.
    """
    if picks_per_customer < 1:
        raise ValueError(f"picks_per_customer must be at least 1, got {picks_per_customer}")
    if lookback <= timedelta(0):
        raise ValueError(f"lookback must be positive, got {lookback}")
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1, got {chunk}")
    snapshot = ledger.snapshot(period)
    if snapshot is None:
        raise SnapshotMissing(f"period {period} has no frozen eligibility snapshot")
    customers = empty = failed = 0
    sample: list[OperationKey] = []
    written: list[int] = []
    # With the runtime's executor over a database server, a chunk's rows are written while the
    # next chunk is read and picked; one write in flight keeps one extra chunk in memory.
    with (
        executor.bulk(),
        executor.writes(WRITES_IN_FLIGHT, "content") as writes,
    ):
        content = plan_content(source, period, lookback, picks_rule)
        # the ledger's keys carry its instance; rows written under any other would be no one's
        instance = ledger.instance
        for ids in chunked(ledger.iter_needing_content(period, page=chunk), chunk):
            keys = [OperationKey(period, customer_id, instance) for customer_id in ids]
            generated = content.content_of(source, keys, picks_per_customer)
            empty += generated.without_picks
            failed += len(generated.rule_failed)
            sample.extend(generated.rule_failed[: RULE_FAILED_KEPT - len(sample)])
            customers += len(keys)
            if generated.rows:
                writes.submit(written.append, ledger.add_digest_rows, generated.rows)
    rows = sum(written)
    # the snapshot is frozen, so everyone it holds who needed nothing was skipped
    skipped = snapshot.eligible_count - customers

    report = ContentReport(customers, rows, skipped, empty, content.excluded, failed, tuple(sample))
    _log_report(report, content, period)
    return report


def _log_report(report: ContentReport, content: ContentPlan, period: Period) -> None:
    step_log.info(
        "content_generated",
        period=period,
        customers=report.customers,
        rows=report.rows,
        skipped_existing=report.skipped_existing,
        products=content.products,
        orders=content.orders,
        excluded_products=len(report.excluded) or None,
    )
    if report.without_picks:
        step_log.warning(
            "content_without_picks",
            period=period,
            customers=report.without_picks,
        )
    if report.picks_rule_failed:
        # one line for the step's log (Dagster's run log); each customer's own line, with the
        # reason, is on the item logger under its operation key
        step_log.warning(
            "content_picks_rule_failed",
            period=period,
            customers=report.picks_rule_failed,
            rule=content.rule_name,
            keys=",".join(str(k) for k in report.picks_rule_failed_sample),
        )
