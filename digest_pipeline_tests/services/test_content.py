"""Digest content: rows for every frozen customer who needs them, and never twice."""

import logging
from datetime import timedelta

import pytest

from digest_pipeline.domain.catalogue import Order, Product
from digest_pipeline.domain.errors import SnapshotMissing
from digest_pipeline.domain.model import CleanupMode
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.services.cleanup import clean_period
from digest_pipeline.services.content import ContentReport, generate_content
from digest_pipeline.services.enqueue import enqueue_period
from digest_pipeline.services.snapshot import take_snapshot
from digest_pipeline_tests import builders
from digest_pipeline_tests.builders import (
    customer_id,
    deliver_all,
    email_of,
    key_of,
    make_customer,
    make_deliverer,
    rows_of,
    state_of,
)
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.fakes import FakeComposer, FakeCustomerSource, FakeLedger, FakeMailer

OLD = W42.starts_at - timedelta(days=300)
#: a day inside the default 12-week look-back before the end of W42
IN_WINDOW = W42.starts_at - timedelta(days=10)


def product(product_id: str, category: str, created_at=OLD) -> Product:
    return Product(
        product_id,
        f"Title of {product_id}",
        category,
        1250,
        "EUR",
        f"https://shop.example/p/{product_id}",
        None,
        created_at,
    )


PRODUCTS = [
    product("k-1", "Kitchen"),
    product("k-2", "Kitchen"),
    product("k-3", "Kitchen"),
    product("g-1", "Garden"),
    product("g-2", "Garden"),
    product("b-1", "Books"),
    product("n-1", "Toys", created_at=W42.starts_at + timedelta(days=2)),
]


def order(n: int, customer: int, product_id: str, at=IN_WINDOW) -> Order:
    return Order(f"order-{n:03d}", customer_id(customer), product_id, at)


ORDERS = [
    order(1, 1, "k-1"),
    order(2, 2, "g-1"),
    # customer 4 is inactive, but their orders still make the best sellers
    *(order(10 + i, 4, "k-2") for i in range(3)),
    *(order(20 + i, 4, "g-2") for i in range(2)),
    *(order(30 + i, 4, "b-1") for i in range(5)),
]


def shop(orders=ORDERS, products=PRODUCTS) -> FakeCustomerSource:
    customers = [make_customer(1), make_customer(2), make_customer(3)]
    customers.append(make_customer(4, active=False))
    return FakeCustomerSource(customers, products, orders)


def frozen(source: FakeCustomerSource, clock) -> FakeLedger:
    ledger = FakeLedger()
    take_snapshot(source, ledger, clock, W42, "run-1")
    return ledger


def picked(ledger: FakeLedger, n: int) -> list[str]:
    return [str(r.payload["product_id"]) for r in rows_of(ledger, key_of(n))]


def test_every_frozen_customer_gets_rows_under_their_own_operation_key(clock):
    source = shop()
    ledger = frozen(source, clock)

    report = generate_content(source, ledger, W42)

    assert report == ContentReport(customers=3, rows=12, skipped_existing=0)
    assert ledger.keys_with_rows(W42) == {key_of(1), key_of(2), key_of(3)}
    for n in (1, 2, 3):
        rows = rows_of(ledger, key_of(n))
        assert [(r.key, r.position) for r in rows] == [(key_of(n), p) for p in range(4)]


def test_picks_follow_the_customers_categories_then_new_arrivals_then_best_sellers(clock):
    source = shop()
    ledger = frozen(source, clock)

    generate_content(source, ledger, W42)

    assert picked(ledger, 1) == ["k-2", "n-1", "b-1", "g-2"]  # bought in Kitchen
    assert picked(ledger, 2) == ["g-2", "n-1", "b-1", "k-2"]  # bought in Garden
    assert picked(ledger, 3) == ["n-1", "b-1", "k-2", "g-2"]  # bought nothing


def test_rows_carry_what_the_renderer_needs(clock):
    source = shop()
    ledger = frozen(source, clock)

    generate_content(source, ledger, W42)

    assert rows_of(ledger, key_of(1))[0].payload == {
        "title": "Title of k-2",
        "price": "12.50",
        "currency": "EUR",
        "url": "https://shop.example/p/k-2",
        "image_url": None,
        "category": "Kitchen",
        "product_id": "k-2",
    }


def test_customers_outside_the_snapshot_get_nothing(clock):
    source = shop()
    ledger = frozen(source, clock)

    generate_content(source, ledger, W42)

    assert rows_of(ledger, key_of(4)) == []


def test_only_orders_inside_the_look_back_window_count(clock):
    orders = [
        order(1, 1, "k-1", at=W42.ends_at - timedelta(weeks=1)),  # the window's first instant
        order(2, 1, "g-1", at=W42.ends_at),  # after the period: not bought yet
        order(3, 4, "b-1", at=W42.ends_at - timedelta(weeks=1, seconds=1)),  # too old to count
        order(4, 4, "k-2", at=W42.ends_at - timedelta(seconds=1)),
    ]
    source = shop(orders=orders)
    ledger = frozen(source, clock)

    generate_content(source, ledger, W42, lookback=timedelta(weeks=1), picks_per_customer=7)

    # k-2 is the one best seller in the window; b-1 sold only before it, so it ranks by id
    assert picked(ledger, 1) == ["k-2", "n-1", "b-1", "g-1", "g-2", "k-3"]


def test_picks_per_customer_bounds_the_rows(clock):
    source = shop()
    ledger = frozen(source, clock)

    report = generate_content(source, ledger, W42, picks_per_customer=2)

    assert report.rows == 6
    assert picked(ledger, 1) == ["k-2", "n-1"]


def test_a_rerun_generates_nothing_new(clock):
    source = shop()
    ledger = frozen(source, clock)
    generate_content(source, ledger, W42)
    before = {n: rows_of(ledger, key_of(n)) for n in (1, 2, 3)}

    report = generate_content(source, ledger, W42)

    assert report == ContentReport(customers=0, rows=0, skipped_existing=3)
    assert {n: rows_of(ledger, key_of(n)) for n in (1, 2, 3)} == before


def test_only_customers_without_rows_get_new_ones_and_existing_rows_stay(clock):
    source = shop()
    ledger = frozen(source, clock)
    existing = builders.digest_rows_for(key_of(2), 2, count=2)
    ledger.add_digest_rows(existing)

    report = generate_content(source, ledger, W42)

    assert (report.customers, report.rows, report.skipped_existing) == (2, 8, 1)
    assert rows_of(ledger, key_of(2)) == existing
    assert [len(rows_of(ledger, key_of(n))) for n in (1, 3)] == [4, 4]


def test_an_empty_selection_needs_no_content(clock):
    ledger = FakeLedger()
    ledger.freeze_snapshot(W42, "run-1", clock.now(), [])

    assert generate_content(shop(), ledger, W42) == ContentReport(0, 0, 0)


def test_work_items_that_do_not_exist_yet_or_are_pending_need_content(clock):
    source = shop()
    ledger = frozen(source, clock)
    enqueue_period(ledger, clock, W42)

    report = generate_content(source, ledger, W42)

    assert report.customers == 3
    assert {state_of(ledger, key_of(n)) for n in (1, 2, 3)} == {DeliveryState.PENDING}


def delivered_and_cleaned(clock) -> tuple[FakeCustomerSource, FakeLedger]:
    source = shop()
    ledger = frozen(source, clock)
    generate_content(source, ledger, W42)
    enqueue_period(ledger, clock, W42)
    deliver_all(make_deliverer(ledger, FakeMailer(clock=clock), clock))
    clean_period(ledger, clock, W42, CleanupMode.DELETE)
    assert {state_of(ledger, key_of(n)) for n in (1, 2, 3)} == {DeliveryState.CLEANED}
    assert ledger.keys_with_rows(W42) == set()
    return source, ledger


def test_cleaned_items_never_get_their_rows_back(clock):
    source, ledger = delivered_and_cleaned(clock)

    report = generate_content(source, ledger, W42)

    assert report == ContentReport(customers=0, rows=0, skipped_existing=3)
    assert ledger.keys_with_rows(W42) == set()


def test_sent_items_get_nothing_new(clock):
    source = shop()
    ledger = frozen(source, clock)
    generate_content(source, ledger, W42)
    enqueue_period(ledger, clock, W42)
    deliver_all(make_deliverer(ledger, FakeMailer(clock=clock), clock))
    assert {state_of(ledger, key_of(n)) for n in (1, 2, 3)} == {DeliveryState.SENT}

    report = generate_content(source, ledger, W42)

    assert (report.customers, report.rows) == (0, 0)
    assert [len(rows_of(ledger, key_of(n))) for n in (1, 2, 3)] == [4, 4, 4]


def test_a_failed_item_without_rows_gets_content_for_its_replay(clock):
    source = shop()
    ledger = frozen(source, clock)
    enqueue_period(ledger, clock, W42)
    composer = FakeComposer()
    composer.fail_for(customer_id(1))  # e.g. it had no rows to render
    deliver_all(make_deliverer(ledger, FakeMailer(clock=clock), clock, composer=composer))
    assert state_of(ledger, key_of(1)) is DeliveryState.FAILED

    report = generate_content(source, ledger, W42)

    # customers 2 and 3 were sent (with no rows): they are done and stay as they are
    assert (report.customers, report.skipped_existing) == (1, 2)
    assert ledger.keys_with_rows(W42) == {key_of(1)}


def test_an_empty_catalogue_is_reported_and_retried_on_the_next_run(clock, caplog):
    caplog.set_level(logging.INFO, logger="digest_pipeline")
    ledger = frozen(shop(), clock)

    report = generate_content(shop(products=[]), ledger, W42)
    assert report == ContentReport(customers=3, rows=0, skipped_existing=0, without_picks=3)
    assert any("event=content_without_picks" in r.getMessage() for r in caplog.records)

    assert generate_content(shop(), ledger, W42).rows == 12


def test_a_period_without_a_snapshot_is_refused_and_nothing_is_written(clock):
    ledger = FakeLedger()

    with pytest.raises(SnapshotMissing, match="2026-W42"):
        generate_content(shop(), ledger, W42)

    assert ledger.keys_with_rows(W42) == set()


@pytest.mark.parametrize(
    "bounds",
    [
        {"picks_per_customer": 0},  # an empty digest would fail to render for everyone
        {"lookback": timedelta(0)},  # no orders could ever count
    ],
)
def test_bounds_that_cannot_produce_content_are_refused(clock, bounds):
    source = shop()
    ledger = frozen(source, clock)

    with pytest.raises(ValueError, match=next(iter(bounds))):
        generate_content(source, ledger, W42, **bounds)


def test_logs_carry_counts_and_the_period_never_addresses_or_titles(clock, caplog):
    caplog.set_level(logging.DEBUG, logger="digest_pipeline")
    source = shop()
    ledger = frozen(source, clock)

    generate_content(source, ledger, W42)

    messages = [r.getMessage() for r in caplog.records if r.name.startswith("digest_pipeline")]
    content = [m for m in messages if m.startswith("event=content_generated")]
    assert content == [
        "event=content_generated period=2026-W42 customers=3 rows=12 skipped_existing=0 "
        "products=7 orders=12"
    ]
    secrets = [email_of(n) for n in range(1, 5)] + [p.title for p in PRODUCTS]
    assert [(m, s) for m in messages for s in secrets if s in m] == []
