"""A shop source in its own database and schema reads the same records the demo tables hold.

The demo shop is copied into `users` / `catalog_items` / `purchases` (shop_schema.py) in a second
database (SQLite) or schema (PostgreSQL); mapped by tables and columns or by queries, the source
must stream exactly the demo's customers, products and orders, in the same stable order, look
orders up by customer (integer ids included), and give the same snapshot and digest rows.
"""

import sqlite3
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text

from digest_pipeline.adapters.demo_data import seed_demo
from digest_pipeline.adapters.sql import customer_source
from digest_pipeline.adapters.sql.customer_source import SqlCustomerSource
from digest_pipeline.domain.catalogue import Order
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.services.content import generate_content
from digest_pipeline.services.snapshot import take_snapshot
from digest_pipeline.wiring import build_customer_source
from digest_pipeline_tests.adapters.shop_schema import (
    ALL_TIME,
    PG_SCHEMA,
    copy_demo,
    members_config,
    query_config,
    source_settings,
    table_config,
)
from digest_pipeline_tests.conftest import SQL_BACKENDS, T0, W42, require_postgres_url
from digest_pipeline_tests.fakes import FakeLedger, FixedClock

CUSTOMERS = 60
SINCE, UNTIL = W42.ends_at - timedelta(weeks=12), W42.ends_at
CONFIGS = {"tables": table_config, "queries": query_config}


@dataclass
class Shop:
    """A seeded demo ledger and, elsewhere, the shop's own tables holding the same records."""

    ledger: Engine
    url: str
    schema: str | None
    folder: Path

    @property
    def demo(self) -> SqlCustomerSource:
        return SqlCustomerSource(self.ledger)

    def source(self, config: Callable[[str | None], str]) -> SqlCustomerSource:
        settings = source_settings(self.folder, self.url, config(self.schema))
        built = build_customer_source(settings, self.ledger)
        assert isinstance(built, SqlCustomerSource)
        return built


@pytest.fixture(params=SQL_BACKENDS)
def shop(
    request: pytest.FixtureRequest, sql_engine_factory: Callable[[str], Engine], tmp_path: Path
) -> Iterator[Shop]:
    ledger = sql_engine_factory(request.param)
    seed_demo(ledger, customers=CUSTOMERS, seed=7, now=T0)
    if request.param == "sqlite":
        path = tmp_path / "shop.db"
        engine = create_engine(f"sqlite:///{path}")
        copy_demo(SqlCustomerSource(ledger), engine, None)
        engine.dispose()
        yield Shop(ledger, f"sqlite:///{path}", None, tmp_path)
        return
    copy_demo(SqlCustomerSource(ledger), ledger, PG_SCHEMA)
    yield Shop(ledger, require_postgres_url(), PG_SCHEMA, tmp_path)
    with ledger.begin() as conn:
        conn.execute(text(f"DROP SCHEMA {PG_SCHEMA} CASCADE"))


@pytest.mark.parametrize("form", sorted(CONFIGS))
def test_a_mapped_shop_streams_the_demo_records_in_the_same_order(shop, form):
    mapped, demo = shop.source(CONFIGS[form]), shop.demo

    assert list(mapped.customers()) == list(demo.customers())
    assert list(mapped.products()) == list(demo.products())
    assert list(mapped.orders(SINCE, UNTIL)) == list(demo.orders(SINCE, UNTIL))
    assert mapped.popularity(SINCE, UNTIL) == demo.popularity(SINCE, UNTIL)


@pytest.mark.parametrize("form", sorted(CONFIGS))
def test_orders_of_a_chunk_of_customers_are_theirs_and_all_of_theirs(shop, form, monkeypatch):
    monkeypatch.setattr(customer_source, "IDS", 7)  # several IN lists per call
    mapped = shop.source(CONFIGS[form])
    ids = [c.customer_id for c in mapped.customers()][::2]

    found = sorted(mapped.orders_of([*ids, "no-such-customer"], SINCE, UNTIL), key=_key)

    wanted = set(ids)
    assert found == sorted(
        (o for o in mapped.orders(SINCE, UNTIL) if o.customer_id in wanted), key=_key
    )
    assert found


@pytest.mark.parametrize("form", sorted(CONFIGS))
def test_a_mapped_shop_freezes_the_same_snapshot_and_rows_as_the_demo_tables(shop, form):
    results = []
    for source in (shop.source(CONFIGS[form]), shop.demo):
        ledger = FakeLedger()
        report = take_snapshot(source, ledger, FixedClock(T0), W42, "run-1")
        generate_content(source, ledger, W42)
        entries = ledger.snapshot_entries(W42)
        rows = ledger.digest_rows_of([OperationKey(W42, e.customer_id) for e in entries])
        results.append((report.eligible, report.considered, entries, rows))

    assert results[0] == results[1]
    assert results[0][0] > 0


def test_integer_customer_ids_are_read_as_text_in_numeric_order_and_looked_up(shop, monkeypatch):
    monkeypatch.setattr(customer_source, "IDS", 5)
    mapped = shop.source(members_config)
    people = list(mapped.customers())
    numbers = [int(c.customer_id) for c in people]
    by_email = {c.email: c.customer_id for c in people}
    demo_ids = {c.customer_id: by_email[c.email] for c in shop.demo.customers()}

    asked = [str(n) for n in numbers[1::3]]
    # ids no integer column holds: asked for, never an error, never a match
    found = list(mapped.orders_of([*asked, "customer-0001", "007", "1e3", ""], SINCE, UNTIL))

    assert numbers == sorted(numbers) == list(range(1, CUSTOMERS + 1))
    expected = [
        Order(o.order_id, demo_ids[o.customer_id], o.product_id, o.ordered_at)
        for o in shop.demo.orders(SINCE, UNTIL)
        if demo_ids[o.customer_id] in asked
    ]
    assert sorted(found, key=_key) == sorted(expected, key=_key)
    assert found


def test_a_query_may_hold_a_colon_word_as_text(shop):
    def colon(schema: str | None) -> str:
        s = f"{schema}." if schema else ""
        return query_config(schema).replace(
            f"FROM {s}users", f"FROM {s}users WHERE mail <> ':nobody' AND ':x' = ':x'"
        )

    assert list(shop.source(colon).customers()) == list(shop.demo.customers())


def _key(o: Order) -> tuple[str, str]:
    return (o.order_id, o.customer_id)


# -- SQLite: what a plain shop file holds ----------------------------------------------------


def _plain_shop(path: Path, times: list[str]) -> None:
    """A shop written by another program: times as text, one order per entry of `times`."""
    with sqlite3.connect(path) as db:
        db.executescript(
            """
            CREATE TABLE users (id INTEGER PRIMARY KEY, mail TEXT, consent INTEGER, gone TEXT);
            CREATE TABLE items (sku TEXT PRIMARY KEY, title TEXT, category TEXT,
                                price_cents INTEGER, currency TEXT, url TEXT, created_at TEXT);
            CREATE TABLE buys (id TEXT PRIMARY KEY, user_id INTEGER, sku TEXT, at TEXT);
            INSERT INTO users VALUES (1, 'one@shop.example', 1, NULL);
            INSERT INTO items VALUES ('p1', 'Pan', 'Kitchen', 1200, 'EUR',
                                      'https://shop.example/p1', '2026-01-01 00:00:00');
            """
        )
        db.executemany(
            "INSERT INTO buys VALUES (?, 1, 'p1', ?)", [(f"b{n}", t) for n, t in enumerate(times)]
        )
    db.close()


PLAIN = """
customers:
  query: SELECT id AS customer_id, mail AS email, consent AS opted_in, gone IS NULL AS active FROM users
products: {table: items, columns: {product_id: sku, image_url: null}}
orders: {table: buys, columns: {order_id: id, customer_id: user_id, product_id: sku, ordered_at: at}}
"""


def _since_until(fmt: str) -> list[str]:
    return [fmt.format(d) for d in (SINCE, UNTIL)]


@pytest.mark.parametrize(
    "spelling",
    [
        # SQLite's own datetime(): no fraction, so a bound's `.000000` must not push it outside
        "{:%Y-%m-%d %H:%M:%S}",
        "{:%Y-%m-%dT%H:%M:%S}",
        "{:%Y-%m-%d %H:%M:%S.%f}",
    ],
)
def test_a_window_holds_its_first_instant_and_not_its_end_however_sqlite_text_spells_them(
    sql_engine_factory, tmp_path, spelling
):
    inside = ["b0"]  # the order at SINCE; b1 is at UNTIL
    path = tmp_path / "plain.db"
    _plain_shop(path, _since_until(spelling))
    settings = source_settings(tmp_path, f"sqlite:///{path}", PLAIN)
    source = build_customer_source(settings, sql_engine_factory("sqlite"))

    assert [o.order_id for o in source.orders(SINCE, UNTIL)] == inside
    assert source.popularity(SINCE, UNTIL) == Counter({"p1": len(inside)})
    assert [o.order_id for o in source.orders_of(["1"], SINCE, UNTIL)] == inside
    assert [o.ordered_at for o in source.orders(*ALL_TIME)] == [SINCE, UNTIL]


def test_a_shop_file_is_read_without_a_byte_of_it_changing(sql_engine_factory, tmp_path):
    path = tmp_path / "plain.db"
    _plain_shop(path, [f"{T0 - timedelta(days=3):%Y-%m-%d %H:%M:%S}"])
    before = path.read_bytes()
    settings = source_settings(tmp_path, f"sqlite:///{path}", PLAIN)

    source = build_customer_source(settings, sql_engine_factory("sqlite"))
    people = list(source.customers())
    take_snapshot(source, FakeLedger(), FixedClock(T0), W42, "run-1")

    assert [c.customer_id for c in people] == ["1"]
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("plain")) == ["plain.db"]
    assert [p.created_at for p in source.products()] == [datetime(2026, 1, 1, tzinfo=UTC)]
