"""Content generated a chunk of customers at a time is exactly what an all-in-memory pass gives.

Streaming is only a change of memory profile: the rows, their positions and the picks
must not depend on where the chunks fall, and the per-chunk checks must skip what the
whole-period checks skipped.
"""

from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, insert

from digest_pipeline.adapters.sql import customer_source
from digest_pipeline.adapters.sql.customer_source import SqlCustomerSource
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.adapters.sql.schema import customers, orders, products
from digest_pipeline.domain.catalogue import Order, PickPlan, Product, digest_rows_for
from digest_pipeline.domain.model import DigestRow
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.ports import CustomerSource, Ledger
from digest_pipeline.services.content import ContentReport, generate_content
from digest_pipeline.services.enqueue import enqueue_period
from digest_pipeline.services.snapshot import take_snapshot
from digest_pipeline_tests import builders
from digest_pipeline_tests.builders import customer_id, key_of, make_customer
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.fakes import FakeCustomerSource, FakeLedger, FixedClock

CUSTOMERS = 10
CHUNK = 3
LOOKBACK = timedelta(weeks=12)
SINCE, UNTIL = W42.ends_at - LOOKBACK, W42.ends_at
CATEGORIES = ("Kitchen", "Garden", "Books", "Toys")


def catalogue() -> list[Product]:
    made = []
    for n in range(12):
        # two products are new arrivals of W42, the rest are old
        created = W42.starts_at + timedelta(days=n) if n >= 10 else SINCE - timedelta(days=90)
        made.append(
            Product(
                f"p-{n:02d}",
                f"Product {n}",
                CATEGORIES[n % len(CATEGORIES)],
                100 * (n + 1),
                "EUR",
                f"https://shop.example/p/{n}",
                None,
                created,
            )
        )
    return made


def order_lines() -> list[Order]:
    """Varied purchases: a few per customer, some outside the window, some by non-selected ones."""
    made = []
    for n in range(1, CUSTOMERS + 3):  # customers 11 and 12 are not in the snapshot
        for i in range(n % 4 + 1):
            product = f"p-{(n * 7 + i * 5) % 12:02d}"
            at = SINCE + timedelta(days=3 * n + i, hours=i)
            made.append(Order(f"o-{n:02d}-{i}", customer_id(n), product, at))
    made.append(Order("o-too-old", customer_id(1), "p-03", SINCE - timedelta(seconds=1)))
    made.append(Order("o-too-new", customer_id(2), "p-04", UNTIL))
    made.append(Order("o-first-instant", customer_id(3), "p-05", SINCE))
    return made


def fake_shop() -> FakeCustomerSource:
    selected = [make_customer(n) for n in range(1, CUSTOMERS + 1)]
    return FakeCustomerSource(selected, catalogue(), order_lines())


def sql_shop(engine: Engine) -> SqlCustomerSource:
    created = datetime(2026, 1, 1, tzinfo=UTC)
    with engine.begin() as conn:
        conn.execute(
            insert(customers),
            [{**vars(make_customer(n)), "created_at": created} for n in range(1, CUSTOMERS + 1)],
        )
        conn.execute(insert(products), [vars(p) for p in catalogue()])
        conn.execute(insert(orders), [vars(o) for o in order_lines()])
    return SqlCustomerSource(engine)


def in_memory(keys: Sequence[OperationKey], picks: int = 4) -> dict[OperationKey, list[DigestRow]]:
    """The straightforward computation: every window order in memory at once."""
    window = [o for o in order_lines() if SINCE <= o.ordered_at < UNTIL]
    bought: defaultdict[str, list[Order]] = defaultdict(list)
    for o in window:
        bought[o.customer_id].append(o)
    plan = PickPlan(
        {p.product_id: p for p in catalogue()}, Counter(o.product_id for o in window), W42
    )
    return {k: digest_rows_for(k, plan.picks(bought[k.customer_id], picks)) for k in keys}


def frozen(source: CustomerSource, ledger: Ledger, clock: FixedClock) -> Ledger:
    take_snapshot(source, ledger, clock, W42, "run-1")
    return ledger


@pytest.fixture(params=["fake", "sql"])
def source(  # the SQL source is only on SQLite: it reads no differently on PostgreSQL
    request: pytest.FixtureRequest, sql_engine_factory: Callable[[str], Engine]
) -> CustomerSource:
    if request.param == "fake":
        return fake_shop()
    return sql_shop(sql_engine_factory("sqlite"))


ALL = [key_of(n) for n in range(1, CUSTOMERS + 1)]


def test_chunked_content_equals_the_all_in_memory_computation(source, ledger, clock):
    frozen(source, ledger, clock)

    report = generate_content(source, ledger, W42, chunk=CHUNK)

    assert report == ContentReport(customers=CUSTOMERS, rows=4 * CUSTOMERS, skipped_existing=0)
    assert ledger.digest_rows_of(ALL) == in_memory(ALL)


@pytest.mark.parametrize("chunk", [1, 2, CHUNK, CUSTOMERS - 1, CUSTOMERS, 1_000])
def test_where_the_chunks_fall_changes_nothing(clock, chunk):
    source = fake_shop()
    ledger = frozen(source, FakeLedger(), clock)

    report = generate_content(source, ledger, W42, chunk=chunk, picks_per_customer=6)

    assert (report.customers, report.rows) == (CUSTOMERS, 6 * CUSTOMERS)
    assert ledger.digest_rows_of(ALL) == in_memory(ALL, picks=6)


def test_customers_with_rows_in_several_chunks_are_skipped_and_kept(source, ledger, clock):
    frozen(source, ledger, clock)
    # one at the edge of the first chunk, one inside the second, the last one alone in its chunk
    kept = {n: builders.digest_rows_for(key_of(n), n, count=2) for n in (3, 5, 10)}
    for rows in kept.values():
        ledger.add_digest_rows(rows)

    report = generate_content(source, ledger, W42, chunk=CHUNK)

    assert report == ContentReport(customers=7, rows=28, skipped_existing=3)
    generated = [k for k in ALL if k.customer_id not in {customer_id(n) for n in kept}]
    assert ledger.digest_rows_of(generated) == in_memory(generated)
    assert ledger.digest_rows_of([key_of(n) for n in kept]) == {
        key_of(n): r for n, r in kept.items()
    }


def test_a_chunked_rerun_skips_everyone_and_changes_nothing(source, ledger, clock):
    frozen(source, ledger, clock)
    generate_content(source, ledger, W42, chunk=CHUNK)
    before = ledger.digest_rows_of(ALL)

    report = generate_content(source, ledger, W42, chunk=CHUNK)

    assert report == ContentReport(customers=0, rows=0, skipped_existing=CUSTOMERS)
    assert ledger.digest_rows_of(ALL) == before


class Recording(FakeCustomerSource):
    """Remembers how many customers each `orders_of` call asked for."""

    def __init__(self) -> None:
        shop = fake_shop()
        super().__init__(shop.customers(), shop.products(), shop.orders(SINCE, UNTIL))
        self.asked: list[int] = []

    def orders_of(
        self, customer_ids: Sequence[str], since: datetime, until: datetime
    ) -> Iterator[Order]:
        self.asked.append(len(customer_ids))
        return super().orders_of(customer_ids, since, until)


class RecordingLedger(SqlLedger):
    """Remembers the size of every write."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.writes: list[int] = []

    def add_digest_rows(self, rows: Any) -> int:
        written = super().add_digest_rows(list(rows))
        self.writes.append(written)
        return written


def test_each_chunk_is_read_and_written_on_its_own(sql_engine_factory, clock):
    source = Recording()
    ledger = RecordingLedger(sql_engine_factory("sqlite"))
    frozen(source, ledger, clock)

    generate_content(source, ledger, W42, chunk=CHUNK)

    assert source.asked == [3, 3, 3, 1]
    assert ledger.writes == [12, 12, 12, 4]


def test_a_chunk_below_one_is_refused(clock):
    source = fake_shop()

    with pytest.raises(ValueError, match="chunk"):
        generate_content(source, frozen(source, FakeLedger(), clock), W42, chunk=0)


# -- the port methods the chunks are read with --------------------------------------------------


def test_orders_of_gives_exactly_the_window_orders_of_exactly_the_asked_customers(source):
    asked = [customer_id(n) for n in (1, 2, 3, 11)] + [customer_id(2)]  # a duplicate id too

    got = sorted(source.orders_of(asked, SINCE, UNTIL), key=lambda o: o.order_id)

    expected = [
        o for o in order_lines() if o.customer_id in set(asked) and SINCE <= o.ordered_at < UNTIL
    ]
    assert got == sorted(expected, key=lambda o: o.order_id)
    assert {"o-first-instant"} <= {o.order_id for o in got}
    assert not {"o-too-old", "o-too-new"} & {o.order_id for o in got}


def test_popularity_counts_exactly_the_window_order_lines_per_product(source):
    expected = Counter(o.product_id for o in order_lines() if SINCE <= o.ordered_at < UNTIL)

    assert source.popularity(SINCE, UNTIL) == expected
    assert source.popularity(UNTIL, UNTIL) == Counter()


def test_orders_of_nobody_or_of_customers_without_orders_is_empty(source):
    assert list(source.orders_of([], SINCE, UNTIL)) == []
    assert list(source.orders_of(["nobody"], SINCE, UNTIL)) == []


def test_sql_orders_of_splits_long_id_lists(sql_engine_factory, monkeypatch):
    monkeypatch.setattr(customer_source, "IDS", 2)
    source = sql_shop(sql_engine_factory("sqlite"))
    asked = [customer_id(n) for n in range(1, CUSTOMERS + 3)]

    got = {o.order_id for o in source.orders_of(asked, SINCE, UNTIL)}

    assert got == {o.order_id for o in order_lines() if SINCE <= o.ordered_at < UNTIL}


def test_the_default_orders_of_filters_the_window():
    """A source that only has `orders` still answers `orders_of` correctly (if slowly)."""

    class OnlyOrders(CustomerSource):
        def customers(self) -> Iterator[Any]:
            return iter(())

        def products(self) -> Iterator[Product]:
            return iter(())

        def orders(self, since: datetime, until: datetime) -> Iterator[Order]:
            return (o for o in order_lines() if since <= o.ordered_at < until)

    got = list(OnlyOrders().orders_of([customer_id(3)], SINCE, UNTIL))

    assert got == [
        o
        for o in order_lines()
        if o.customer_id == customer_id(3) and SINCE <= o.ordered_at < UNTIL
    ]


@pytest.mark.parametrize("page", [1, CHUNK, CUSTOMERS, 1_000])
def test_snapshot_entries_stream_in_pages_to_the_same_selection(ledger, clock, page):
    frozen(fake_shop(), ledger, clock)

    assert list(ledger.iter_snapshot_entries(W42, page=page)) == ledger.snapshot_entries(W42)
    assert list(ledger.iter_snapshot_entries(Period(2026, 41), page=page)) == []


def test_items_of_gives_the_items_that_exist(ledger, clock):
    frozen(fake_shop(), ledger, clock)
    assert ledger.items_of(ALL) == {}
    enqueue_period(ledger, clock, W42)

    found = ledger.items_of([*ALL[:4], key_of(99), ALL[0]])

    assert found == {k: ledger.get(k) for k in ALL[:4]}
