"""Product picks for one customer's digest, and the rows that carry them to the renderer."""

import random
from datetime import timedelta

import pytest

from digest_pipeline.domain.catalogue import (
    Order,
    Product,
    digest_rows_for,
    pick_products,
    price_text,
)
from digest_pipeline.domain.model import DigestRow
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline_tests.conftest import W42

#: long before the period: not a new arrival
OLD = W42.starts_at - timedelta(days=200)
CUSTOMER = "customer-0001"


def product(product_id: str, category: str = "Kitchen", created_at=OLD, cents=1250) -> Product:
    return Product(
        product_id=product_id,
        title=f"Title of {product_id}",
        category=category,
        price_cents=cents,
        currency="EUR",
        url=f"https://shop.example/p/{product_id}",
        image_url=f"https://shop.example/img/{product_id}.jpg",
        created_at=created_at,
    )


def catalogue(*products: Product) -> dict[str, Product]:
    return {p.product_id: p for p in products}


def bought(*product_ids: str) -> list[Order]:
    return [
        Order(f"order-{i}", CUSTOMER, pid, W42.starts_at - timedelta(days=i + 1))
        for i, pid in enumerate(product_ids)
    ]


def ids(picks: list[Product]) -> list[str]:
    return [p.product_id for p in picks]


def test_top_sellers_of_the_customers_categories_come_first_by_sales():
    products = catalogue(
        product("k-bought", "Kitchen"),
        product("k-1", "Kitchen"),
        product("k-2", "Kitchen"),
        product("g-1", "Garden"),
    )
    popularity = {"k-1": 3, "k-2": 7, "g-1": 50}

    picks = pick_products(bought("k-bought"), products, popularity, W42, limit=2)

    assert ids(picks) == ["k-2", "k-1"]


def test_equal_sales_break_ties_by_product_id():
    products = catalogue(product("k-b"), product("k-a"), product("k-c"), product("k-bought"))
    popularity = {"k-a": 2, "k-b": 2, "k-c": 2}

    picks = pick_products(bought("k-bought"), products, popularity, W42, limit=3)

    assert ids(picks) == ["k-a", "k-b", "k-c"]


def test_never_picks_a_product_the_customer_bought():
    new = W42.starts_at + timedelta(days=1)
    products = catalogue(
        product("k-1", "Kitchen"),  # a best seller in the customer's category
        product("n-1", "Garden", created_at=new),  # a new arrival
        product("b-1", "Books"),  # the overall best seller
    )
    popularity = {"k-1": 10, "n-1": 5, "b-1": 99}

    picks = pick_products(bought("k-1", "n-1", "b-1"), products, popularity, W42, limit=4)

    assert picks == []


def test_new_arrivals_follow_the_category_top_sellers_newest_first():
    products = catalogue(
        product("k-bought", "Kitchen"),
        product("k-1", "Kitchen"),
        product("n-early", "Toys", created_at=W42.starts_at + timedelta(hours=1)),
        product("n-late", "Bath", created_at=W42.starts_at + timedelta(days=6)),
        product("b-1", "Books"),
    )
    popularity = {"k-1": 1, "b-1": 99}

    picks = pick_products(bought("k-bought"), products, popularity, W42, limit=3)

    assert ids(picks) == ["k-1", "n-late", "n-early"]


@pytest.mark.parametrize(
    ("created_at", "is_new"),
    [
        (W42.starts_at, True),  # the week's first instant belongs to it
        (W42.ends_at - timedelta(microseconds=1), True),  # its last instant too
        (W42.ends_at, False),  # next Monday 00:00 is the next week
        (W42.starts_at - timedelta(microseconds=1), False),  # the week before
    ],
)
def test_new_arrivals_are_products_created_inside_the_periods_week(created_at, is_new):
    products = catalogue(product("a-unsold"), product("z-candidate", created_at=created_at))

    picks = pick_products([], products, {}, W42, limit=1)

    # without sales, only a new arrival beats "a-unsold" (which wins the id tie-break)
    assert ids(picks) == (["z-candidate"] if is_new else ["a-unsold"])


def test_overall_best_sellers_fill_up_then_unsold_products_by_id():
    products = catalogue(
        product("k-bought", "Kitchen"),
        product("k-1", "Kitchen"),
        product("b-1", "Books"),
        product("b-2", "Books"),
        product("t-2", "Toys"),
        product("t-1", "Toys"),
    )
    popularity = {"k-1": 1, "b-1": 4, "b-2": 9}

    picks = pick_products(bought("k-bought"), products, popularity, W42, limit=5)

    assert ids(picks) == ["k-1", "b-2", "b-1", "t-1", "t-2"]


def test_unsold_products_of_the_customers_category_are_not_top_sellers():
    products = catalogue(
        product("k-bought", "Kitchen"), product("k-unsold"), product("b-1", "Books")
    )

    picks = pick_products(bought("k-bought"), products, {"b-1": 1}, W42, limit=2)

    assert ids(picks) == ["b-1", "k-unsold"]


def test_a_product_in_several_tiers_is_picked_once():
    new = W42.starts_at + timedelta(days=2)
    products = catalogue(
        product("k-bought", "Kitchen"),
        product("k-new", "Kitchen", created_at=new),  # top seller, new arrival and best seller
        product("b-1", "Books"),
    )
    popularity = {"k-new": 9, "b-1": 1}

    picks = pick_products(bought("k-bought"), products, popularity, W42, limit=4)

    assert ids(picks) == ["k-new", "b-1"]


def test_a_customer_without_orders_gets_new_arrivals_then_best_sellers():
    new = W42.starts_at + timedelta(days=3)
    products = catalogue(product("n-1", "Toys", created_at=new), product("b-1"), product("b-2"))

    picks = pick_products([], products, {"b-2": 3, "b-1": 1}, W42)

    assert ids(picks) == ["n-1", "b-2", "b-1"]


@pytest.mark.parametrize("limit", [0, 1, 3, 4, 10])
def test_returns_at_most_limit_distinct_products(limit):
    products = catalogue(*(product(f"p-{n}", f"cat-{n % 3}") for n in range(8)))
    popularity = {f"p-{n}": n for n in range(8)}

    picks = pick_products(bought("p-0"), products, popularity, W42, limit=limit)

    assert len(picks) == min(limit, 7)
    assert len(set(ids(picks))) == len(picks)


def test_a_negative_limit_is_refused():
    with pytest.raises(ValueError, match="limit"):
        pick_products([], catalogue(product("p-1")), {}, W42, limit=-1)


def test_the_same_inputs_in_any_order_give_the_same_picks():
    new = W42.starts_at + timedelta(days=4)
    all_products = [product(f"p-{n:02d}", f"cat-{n % 4}") for n in range(20)]
    all_products += [product(f"n-{n}", "cat-9", created_at=new) for n in range(3)]
    popularity = {f"p-{n:02d}": n % 5 for n in range(20)}
    orders = bought("p-01", "p-06")
    expected = pick_products(orders, catalogue(*all_products), popularity, W42, limit=6)

    rng = random.Random(42)
    for _ in range(20):
        shuffled = list(all_products)
        rng.shuffle(shuffled)
        popularity_items = list(popularity.items())
        rng.shuffle(popularity_items)
        picks = pick_products(
            list(reversed(orders)), catalogue(*shuffled), dict(popularity_items), W42, limit=6
        )
        assert picks == expected


@pytest.mark.parametrize(
    ("cents", "text"),
    [(1250, "12.50"), (1999, "19.99"), (5, "0.05"), (0, "0.00"), (100_000, "1000.00")],
)
def test_prices_are_written_as_two_decimal_strings(cents, text):
    assert price_text(cents) == text


def test_digest_rows_carry_each_pick_at_its_position_under_the_customers_key():
    key = OperationKey(W42, CUSTOMER)
    first = product("p-1", "Coffee & Tea", cents=1250)
    second = Product(
        "p-2", "Hand Trowel", "Garden", 799, "EUR", "https://shop.example/p/p-2", None, OLD
    )

    rows = digest_rows_for(key, [first, second])

    assert rows == [
        DigestRow(
            key,
            0,
            {
                "title": "Title of p-1",
                "price": "12.50",
                "currency": "EUR",
                "url": "https://shop.example/p/p-1",
                "image_url": "https://shop.example/img/p-1.jpg",
                "category": "Coffee & Tea",
                "product_id": "p-1",
            },
        ),
        DigestRow(
            key,
            1,
            {
                "title": "Hand Trowel",
                "price": "7.99",
                "currency": "EUR",
                "url": "https://shop.example/p/p-2",
                "image_url": None,
                "category": "Garden",
                "product_id": "p-2",
            },
        ),
    ]


def test_no_picks_give_no_rows():
    assert digest_rows_for(OperationKey(W42, CUSTOMER), []) == []
