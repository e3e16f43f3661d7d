"""The demo dataset on SQLite and PostgreSQL: deterministic, idempotent, realistic, and usable.

A seeded shop is read back through `SqlCustomerSource` and taken through snapshot, content,
work items and delivery with the real Jinja2 composer, so the invalid addresses it plants end
`failed` with a permanent render error, as `make demo` shows.
"""

import re
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, select

from digest_pipeline.adapters.demo_data import SeedReport, seed_demo
from digest_pipeline.adapters.mail.render import Jinja2Composer
from digest_pipeline.adapters.sql.customer_source import SqlCustomerSource
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.adapters.sql.schema import customers, orders, products
from digest_pipeline.domain.errors import RenderError
from digest_pipeline.domain.failures import FailureClass
from digest_pipeline.domain.model import DigestRow, WorkItem
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.services.content import generate_content
from digest_pipeline.services.enqueue import enqueue_period
from digest_pipeline.services.snapshot import take_snapshot
from digest_pipeline_tests.builders import deliver_all, failed_invariants, make_deliverer, rows_of
from digest_pipeline_tests.conftest import T0, W42
from digest_pipeline_tests.fakes import FakeCustomerSource, FakeMailer

SOURCE_TABLES = (customers, products, orders)
RESERVED = re.compile(r"[a-z]+(\.[a-z0-9]+)+@example\.(com|org|net)")


def dump(engine: Engine) -> dict[str, list[tuple[object, ...]]]:
    """Every row of the source tables, sorted by primary key."""
    with engine.connect() as conn:
        return {t.name: sorted(tuple(r) for r in conn.execute(select(t))) for t in SOURCE_TABLES}


def fresh_engine(sql_ledger: SqlLedger, sql_engine_factory: Callable[[str], Engine]) -> Engine:
    """Another empty, migrated database of the same backend (PostgreSQL: the same one, emptied)."""
    backend = "postgres" if sql_ledger.engine.dialect.name == "postgresql" else "sqlite"
    return sql_engine_factory(backend)


def composer(clock) -> Jinja2Composer:
    return Jinja2Composer(
        sender="digest@example.com",
        unsubscribe_url="https://shop.example/unsubscribe/{customer_id}?token={token}",
        unsubscribe_secret="test-secret",
        clock=clock,
    )


def test_the_same_seed_gives_identical_tables_in_empty_databases(sql_ledger, sql_engine_factory):
    first = seed_demo(sql_ledger.engine, customers=200, seed=11, now=T0)
    before = dump(sql_ledger.engine)

    other = fresh_engine(sql_ledger, sql_engine_factory)
    assert dump(other) == {t.name: [] for t in SOURCE_TABLES}
    second = seed_demo(other, customers=200, seed=11, now=T0)

    assert second == first
    assert dump(other) == before


def test_another_seed_gives_another_shop(sql_ledger, sql_engine_factory):
    seed_demo(sql_ledger.engine, customers=50, seed=1, now=T0)
    one = dump(sql_ledger.engine)

    other = fresh_engine(sql_ledger, sql_engine_factory)
    seed_demo(other, customers=50, seed=2, now=T0)

    assert dump(other)["customers"] != one["customers"]
    assert dump(other)["orders"] != one["orders"]


def test_seeding_twice_leaves_the_same_rows(sql_ledger):
    first = seed_demo(sql_ledger.engine, customers=120, seed=3, now=T0)
    before = dump(sql_ledger.engine)

    second = seed_demo(sql_ledger.engine, customers=120, seed=3, now=T0)

    assert second == first
    assert dump(sql_ledger.engine) == before


def test_seeding_more_customers_later_keeps_the_first_ones(sql_ledger):
    seed_demo(sql_ledger.engine, customers=40, seed=5, now=T0)
    small = dump(sql_ledger.engine)

    report = seed_demo(sql_ledger.engine, customers=60, seed=5, now=T0)

    grown = dump(sql_ledger.engine)
    assert len(grown["customers"]) == report.customers == 60
    assert grown["customers"][: len(small["customers"])] == small["customers"]
    assert set(small["orders"]) <= set(grown["orders"])
    assert grown["products"] == small["products"]


def test_the_report_counts_what_the_tables_hold(sql_ledger):
    report = seed_demo(sql_ledger.engine, customers=500, seed=7, now=T0)

    with sql_ledger.engine.connect() as conn:
        rows = conn.execute(select(customers.c.active, customers.c.opted_in)).all()
        n_orders = len(conn.execute(select(orders.c.order_id)).all())
        n_products = len(conn.execute(select(products.c.product_id)).all())
    assert report == SeedReport(
        customers=len(rows),
        products=n_products,
        orders=n_orders,
        inactive=sum(1 for active, _ in rows if not active),
        not_opted_in=sum(1 for active, opted_in in rows if active and not opted_in),
        invalid_addresses=report.invalid_addresses,
    )


def test_the_shop_looks_like_a_shop(sql_ledger):
    report = seed_demo(sql_ledger.engine, customers=2000, seed=7, now=T0)
    source = SqlCustomerSource(sql_ledger.engine)
    catalogue = list(source.products())
    people = list(source.customers())
    lines = list(source.orders(T0 - timedelta(weeks=52), T0 + timedelta(days=1)))

    assert 50 <= len(catalogue) <= 70
    assert len({p.category for p in catalogue}) == 8
    for p in catalogue:
        assert p.url == f"https://shop.example/p/{p.product_id}"
        assert p.image_url is None or p.image_url.startswith("https://shop.example/img/")
        assert p.price_cents > 0
        assert p.currency == "EUR"
    assert any(W42.starts_at <= p.created_at < W42.ends_at for p in catalogue)

    assert [c.customer_id for c in people][:2] == ["customer-0001", "customer-0002"]
    # roughly 5% inactive, 10% not opted in, 3% invalid addresses
    assert 0.03 <= report.inactive / 2000 <= 0.07
    assert 0.07 <= report.not_opted_in / 2000 <= 0.13
    assert 0.015 <= report.invalid_addresses / 2000 <= 0.045
    valid = [c.email for c in people if RESERVED.fullmatch(c.email)]
    assert len(valid) == 2000 - report.invalid_addresses
    assert len(set(valid)) == len(valid)

    created = {p.product_id: p.created_at for p in catalogue}
    per_customer = Counter(o.customer_id for o in lines)
    inactive = {c.customer_id for c in people if not c.active}
    assert max(per_customer.values()) <= 8
    assert not inactive & set(per_customer)
    for o in lines:
        assert T0 - timedelta(weeks=12) <= o.ordered_at < T0
        assert created[o.product_id] <= o.ordered_at


def test_every_planted_invalid_address_is_refused_by_the_composer(sql_ledger, clock):
    report = seed_demo(sql_ledger.engine, customers=600, seed=7, now=T0)
    render = composer(clock)
    row = DigestRow(
        OperationKey(W42, "customer-0001"),
        0,
        {"title": "Walnut Board", "price": "12.50", "url": "https://shop.example/p/prod-0001"},
    )
    refused = []
    for c in SqlCustomerSource(sql_ledger.engine).customers():
        key = OperationKey(W42, c.customer_id)
        item = WorkItem(key=key, state=DeliveryState.CLAIMED, created_at=T0, next_attempt_at=None)
        try:
            render.compose(item, c.email, [row])
        except RenderError:
            refused.append(c)

    assert len(refused) == report.invalid_addresses > 0
    assert all(c.active and c.opted_in for c in refused)


def test_the_sql_source_streams_orders_in_a_half_open_window_like_the_fake(sql_ledger):
    seed_demo(sql_ledger.engine, customers=150, seed=9, now=T0)
    real = SqlCustomerSource(sql_ledger.engine)
    everything = list(real.orders(T0 - timedelta(weeks=13), T0))
    fake = FakeCustomerSource(products=real.products(), orders=everything)
    middle = everything[len(everything) // 2].ordered_at
    windows = [(W42.starts_at, W42.ends_at), (middle, W42.ends_at), (W42.starts_at, middle)]

    for since, until in windows:
        got = list(real.orders(since, until))
        assert got == list(fake.orders(since, until))
        assert all(since <= o.ordered_at < until for o in got)
    assert list(real.products()) == list(fake.products())
    assert [p.product_id for p in real.products()] == sorted(p.product_id for p in fake.products())


def test_a_snapshot_streams_customers_from_the_ledgers_own_database(sql_ledger, clock):
    # The snapshot reads the source inside the ledger's write transaction; on SQLite a read
    # through the ledger's BEGIN IMMEDIATE engine would wait for itself and fail.
    seeded = seed_demo(sql_ledger.engine, customers=40, seed=2, now=T0)

    report = take_snapshot(SqlCustomerSource(sql_ledger.engine), sql_ledger, clock, W42, "run-1")

    assert report.considered == seeded.customers
    assert report.eligible == len(sql_ledger.snapshot_entries(W42)) > 0


def test_a_seeded_period_flows_from_snapshot_to_content_to_delivery(sql_ledger, clock):
    seeded = seed_demo(sql_ledger.engine, customers=300, seed=7, now=T0)
    source = SqlCustomerSource(sql_ledger.engine)

    snap = take_snapshot(source, sql_ledger, clock, W42, "run-1")
    content = generate_content(source, sql_ledger, W42)
    enqueued = enqueue_period(sql_ledger, clock, W42)
    mailer = FakeMailer(clock=clock)
    report = deliver_all(make_deliverer(sql_ledger, mailer, clock, composer=composer(clock)))

    assert snap.eligible == seeded.customers - seeded.inactive - seeded.not_opted_in
    assert (content.customers, content.rows, content.without_picks) == (
        snap.eligible,
        4 * snap.eligible,
        0,
    )
    assert enqueued.created == snap.eligible
    assert report.outcomes == {
        "sent": snap.eligible - seeded.invalid_addresses,
        "failed": seeded.invalid_addresses,
    }
    failed = sql_ledger.items(W42, [DeliveryState.FAILED])
    assert len(failed) == seeded.invalid_addresses
    assert {i.last_failure_class for i in failed} == {FailureClass.PERMANENT}
    assert failed_invariants(sql_ledger, W42, clock.now()) == []

    # a re-run of the content step (as a re-materialisation does) adds nothing
    again = generate_content(source, sql_ledger, W42)
    assert (again.customers, again.rows, again.skipped_existing) == (0, 0, snap.eligible)


def test_no_customer_is_offered_a_product_they_bought_in_the_look_back(sql_ledger, clock):
    seed_demo(sql_ledger.engine, customers=300, seed=7, now=T0)
    source = SqlCustomerSource(sql_ledger.engine)
    take_snapshot(source, sql_ledger, clock, W42, "run-1")

    generate_content(source, sql_ledger, W42)

    bought: dict[str, set[str]] = {}
    for o in source.orders(W42.ends_at - timedelta(weeks=12), W42.ends_at):
        bought.setdefault(o.customer_id, set()).add(o.product_id)
    keys = sql_ledger.keys_with_rows(W42)
    assert len(keys) == len(sql_ledger.snapshot_entries(W42))
    for key in keys:
        picks = [str(r.payload["product_id"]) for r in rows_of(sql_ledger, key)]
        assert len(set(picks)) == len(picks) == 4
        assert not set(picks) & bought.get(key.customer_id, set())


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"customers": -1, "seed": 1, "now": T0}, "customers"),
        ({"customers": 1, "seed": 1, "now": datetime(2026, 10, 19)}, "timezone"),  # noqa: DTZ001
    ],
)
def test_impossible_arguments_are_refused_before_anything_is_written(
    sql_ledger, arguments, message
):
    with pytest.raises(ValueError, match=message):
        seed_demo(sql_ledger.engine, **arguments)

    assert dump(sql_ledger.engine) == {t.name: [] for t in SOURCE_TABLES}


def test_a_non_utc_now_is_taken_as_the_same_instant(sql_ledger, sql_engine_factory):
    seed_demo(sql_ledger.engine, customers=30, seed=4, now=T0)
    utc = dump(sql_ledger.engine)

    other = fresh_engine(sql_ledger, sql_engine_factory)
    seed_demo(other, customers=30, seed=4, now=T0.astimezone(UTC).astimezone())

    assert dump(other) == utc
