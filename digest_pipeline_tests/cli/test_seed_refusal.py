"""`digest seed` marks only an empty ledger as the demo's, and refuses a real shop's.

A ledger holding a shop's customers, products or orders, or a run's work, and no demo mark is
refused in one line (exit 2) with nothing written: no demo rows and no mark, so the public demo
secret stays refused there. An empty ledger is seeded and marked; the demo's ledger is seeded
again, idempotently for the same `--seed`.
"""

from datetime import timedelta

import pytest
from sqlalchemy import insert

from digest_pipeline.adapters.sql.schema import customers, orders, products
from digest_pipeline_tests.builders import seed_period
from digest_pipeline_tests.conftest import T0

SEED = ("seed", "--customers", "5", "--seed", "3")

SHOP_ROWS = {
    "customers": (
        customers,
        {
            "customer_id": "shop-customer-1",
            "email": "real@shop.example",
            "active": True,
            "opted_in": True,
            "created_at": T0 - timedelta(days=30),
        },
    ),
    "products": (
        products,
        {
            "product_id": "shop-product-1",
            "title": "A real product",
            "category": "Kitchen",
            "price_cents": 1_000,
            "currency": "EUR",
            "url": "https://shop.example/p/1",
            "created_at": T0 - timedelta(days=30),
        },
    ),
    "orders": (
        orders,
        {
            "order_id": "shop-order-1",
            "customer_id": "shop-customer-1",
            "product_id": "shop-product-1",
            "ordered_at": T0 - timedelta(days=3),
        },
    ),
}


def _refused_with_nothing_written(world, table: str) -> None:
    before = world.dump()

    run = world.cli(*SEED)

    assert run.code == 2, run.err
    assert run.out == ""
    assert run.err.count("\n") == 1
    assert run.err.startswith("digest seed: error: this ledger holds ")
    assert table in run.err
    assert world.dump() == before
    assert not world.ledger.holds_demo_data()


@pytest.mark.parametrize("table", sorted(SHOP_ROWS))
def test_a_ledger_with_shop_data_and_no_mark_is_refused(world, table):
    target, row = SHOP_ROWS[table]
    with world.engine.begin() as conn:
        conn.execute(insert(target).values(row))

    _refused_with_nothing_written(world, table)


def test_a_ledger_with_work_items_and_no_mark_is_refused(world):
    seed_period(world.ledger, 3, now=world.clock.now())

    _refused_with_nothing_written(world, "work_items")


def test_an_empty_ledger_is_seeded_and_marked(world):
    assert not world.ledger.holds_demo_data()

    run = world.cli(*SEED)

    assert run.code == 0, run.err
    assert world.ledger.holds_demo_data()
    assert len(world.dump()["customers"]) == 5


def test_the_demo_ledger_is_seeded_again_idempotently(world):
    assert world.cli(*SEED).code == 0
    seed_period(world.ledger, 2, now=world.clock.now())  # the demo's own week, delivered later
    before = world.dump()

    run = world.cli(*SEED)

    assert run.code == 0, run.err
    assert world.dump() == before
