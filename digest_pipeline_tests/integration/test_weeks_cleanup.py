"""Eight consecutive weeks cleaned on the real ledger, in both cleanup modes.

Cleanup deletes a week's rows; were SQLite to give their ids to the next week's rows, the second
week's archive would fail on the first week's ids. One good week proves nothing about the next,
so the invariants are asserted after every week, over every week so far.
"""

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from sqlalchemy import Engine, Table, select

from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.adapters.sql.schema import cleanups, digest_rows, digest_rows_archive
from digest_pipeline.domain.catalogue import Order, Product
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import CleanupMode
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.services.cleanup import clean_period
from digest_pipeline.services.content import generate_content
from digest_pipeline.services.enqueue import enqueue_period
from digest_pipeline.services.snapshot import take_snapshot
from digest_pipeline_tests.builders import (
    customer_id,
    deliver_all,
    failed_invariants,
    key_of,
    make_customer,
    make_deliverer,
)
from digest_pipeline_tests.conftest import SQL_BACKENDS, T0, W42
from digest_pipeline_tests.fakes import FakeCustomerSource, FakeMailer, FixedClock

WEEKS = 8
#: whose digest is refused in a week, by week % 3: customers every week's snapshot selects
REFUSED = (1, 3, 6)
#: (operation key, row id, position, product id): one generated row as the ledger stores it
Row = tuple[str, int, int, str]

PRODUCTS = [
    Product(
        f"prod-{n:02d}",
        f"Oak Shelf No. {n}",
        ("Kitchen", "Garden", "Books")[n % 3],
        1000 + n,
        "EUR",
        f"https://shop.example/p/prod-{n:02d}",
        None,
        W42.starts_at - timedelta(days=400),
    )
    for n in range(1, 13)
]
ORDERS = [
    Order(f"order-{n:03d}", customer_id(c), f"prod-{p:02d}", W42.starts_at - timedelta(days=n))
    for n, (c, p) in enumerate([(1, 1), (2, 2), (3, 3), (3, 4), (5, 5), (6, 1)], start=1)
]


def period_of(week: int) -> Period:
    """The `week`-th period from W42 on (week 0 is W42)."""
    return Period.of((W42.starts_at + timedelta(weeks=week)).date())


@dataclass
class History:
    """What the weeks so far generated, cleaned and kept, to hold the ledger's tables against."""

    generated: dict[str, list[Row]] = field(default_factory=dict)
    cleaned: set[str] = field(default_factory=set)
    kept: set[str] = field(default_factory=set)


def stored_rows(engine: Engine, table: Table = digest_rows) -> list[Row]:
    """The rows of `digest_rows` or its archive, sorted."""
    c = table.c
    q = select(c.operation_key, c.row_id, c.position, c.payload)
    with engine.connect() as conn:
        return sorted(
            (k, i, pos, str(payload["product_id"])) for k, i, pos, payload in conn.execute(q)
        )


def shop_in_week(source: FakeCustomerSource, week: int) -> None:
    """Customers come and go, so each week's snapshot (and its rows) differ."""
    if week == 2:
        source.update(make_customer(7))
    if week == 4:
        source.update(make_customer(2, active=False))
    if week == 6:
        source.update(make_customer(5, opted_in=False))


def run_week(
    ledger: SqlLedger, source: FakeCustomerSource, clock: FixedClock, week: int, mode: CleanupMode
) -> tuple[list[Row], str]:
    """Snapshot, content, work items, then delivery and cleanup twice (a retry comes due in
    between), as the schedule and the sweep would; returns the rows the week generated and the
    key whose digest was refused."""
    period = period_of(week)
    take_snapshot(source, ledger, clock, period, f"run-{week}")
    generate_content(source, ledger, period)
    enqueue_period(ledger, clock, period)
    generated = [r for r in stored_rows(ledger.engine) if r[0].startswith(f"digest:{period}:")]
    mailer = FakeMailer(clock=clock)
    # another customer's digest is refused each week, so a failed item keeps its rows next to
    # cleaned ones; customer 4 gets a transient error and is sent (and cleaned) on the retry
    refused = key_of(REFUSED[week % 3], period)
    mailer.script(refused, SendOutcome.failed(FailureClass.PERMANENT, "smtp:550"))
    mailer.script(key_of(4, period), SendOutcome.failed(FailureClass.TRANSIENT, "smtp:421"))
    deliverer = make_deliverer(ledger, mailer, clock)
    deliver_all(deliverer, period=period)
    clean_period(ledger, clock, period, mode)
    clock.advance(timedelta(hours=1))
    deliver_all(deliverer, period=period)
    clean_period(ledger, clock, period, mode)
    return generated, str(refused)


def assert_weeks_so_far_hold(
    ledger: SqlLedger, clock: FixedClock, mode: CleanupMode, history: History, weeks: int
) -> None:
    engine = ledger.engine
    cleaned: set[str] = set()
    for week in range(weeks):
        period = period_of(week)
        items = ledger.items(period)
        assert items, f"{period} has no work items"
        assert {i.state for i in items} <= {DeliveryState.CLEANED, DeliveryState.FAILED}, period
        assert all(i.state is DeliveryState.CLEANED for i in items if i.sent_at is not None), period
        assert failed_invariants(ledger, period, clock.now()) == [], period
        cleaned |= {str(i.key) for i in items if i.state is DeliveryState.CLEANED}
    assert cleaned == history.cleaned

    with engine.connect() as conn:
        per_key = Counter(conn.execute(select(cleanups.c.operation_key)).scalars())
        modes = set(conn.execute(select(cleanups.c.mode).distinct()).scalars())
    assert per_key == Counter(history.cleaned)
    assert modes == {mode.value}

    expected = sorted(r for k in history.cleaned for r in history.generated[k])
    archived = stored_rows(engine, digest_rows_archive)
    assert archived == (expected if mode is CleanupMode.ARCHIVE else [])
    live = stored_rows(engine)
    assert {r[0] for r in live} == history.kept
    assert live == sorted(r for k in history.kept for r in history.generated[k])


@pytest.mark.parametrize("mode", list(CleanupMode))
@pytest.mark.parametrize("backend", SQL_BACKENDS)
def test_eight_weeks_in_a_row_each_clean_their_own_rows_once(
    backend: str, mode: CleanupMode, sql_engine_factory: Callable[[str], Engine]
) -> None:
    ledger = SqlLedger(sql_engine_factory(backend))
    source = FakeCustomerSource([make_customer(n) for n in range(1, 7)], PRODUCTS, ORDERS)
    clock = FixedClock(T0)
    history = History()
    seen_ids: set[int] = set()

    for week in range(WEEKS):
        shop_in_week(source, week)
        generated, refused = run_week(ledger, source, clock, week, mode)

        selected = {
            f"digest:{period_of(week)}:{e.customer_id}"
            for e in ledger.snapshot_entries(period_of(week))
        }
        assert {r[0] for r in generated} == selected
        assert refused in selected
        ids = {r[1] for r in generated}
        # an id is never handed out twice, not even after its row was cleaned away
        assert not ids & seen_ids
        seen_ids |= ids
        for row in generated:
            history.generated.setdefault(row[0], []).append(row)
        history.kept.add(refused)
        history.cleaned |= selected - {refused}
        assert_weeks_so_far_hold(ledger, clock, mode, history, week + 1)
        clock.advance(timedelta(weeks=1) - timedelta(hours=1))

    assert len(history.cleaned) > len(history.kept) == WEEKS
