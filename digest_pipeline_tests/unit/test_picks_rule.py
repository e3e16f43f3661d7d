"""Any picks rule's answer is held to what the built-in rule keeps by construction: products of
the week's screened catalogue, each once, at most the limit; anything else is `PicksRejected`."""

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from digest_pipeline.domain.catalogue import (
    Order,
    PickPlan,
    PickRequest,
    PicksRejected,
    Product,
    checked_picks,
    pick_products,
    popular_in_your_categories,
)
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline_tests.conftest import W42

OLD = datetime(2025, 1, 1, tzinfo=UTC)
KEY = OperationKey(W42, "customer-0001")


def product(n: int, **overrides: object) -> Product:
    good = Product(
        f"p-{n}", f"Teapot {n}", "Kitchen", 1000 + n, "EUR", f"https://s.example/{n}", None, OLD
    )
    return replace(good, **overrides)  # type: ignore[arg-type]


PRODUCTS = [product(n) for n in range(1, 7)] + [product(9, url="javascript:alert(1)")]
CATALOGUE = {p.product_id: p for p in PRODUCTS}
POPULARITY = {"p-1": 5, "p-2": 9, "p-9": 50}
BOUGHT = (Order("o-1", "customer-0001", "p-2", datetime(2026, 10, 1, tzinfo=UTC)),)


def request(limit: int = 4) -> PickRequest:
    return PickRequest(KEY, BOUGHT, limit, PickPlan(CATALOGUE, POPULARITY, W42))


def test_ids_and_the_catalogues_products_become_the_catalogues_products_in_order():
    r = request()
    answer = ["p-3", r.catalogue["p-1"], "p-5"]

    picked = checked_picks(r, answer)

    assert [p.product_id for p in picked] == ["p-3", "p-1", "p-5"]
    assert all(p is r.catalogue[p.product_id] for p in picked)


def test_an_equal_product_made_by_the_rule_counts_as_the_catalogues():
    r = request()
    assert checked_picks(r, (product(4),)) == [r.catalogue["p-4"]]


def test_no_picks_is_an_answer():
    assert checked_picks(request(), []) == []


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ({"p-1", "p-3"}, "returned a set, not a list or tuple"),
        ("p-1", "returned a str, not a list or tuple"),
        (iter(["p-1"]), "returned a list_iterator, not a list or tuple"),
        (None, "returned a NoneType, not a list or tuple"),
        (["p-1", "p-3", "p-4", "p-5", "p-6"], "returned 5 picks; at most 4"),
        (["p-1", 3], "pick 2 is a int, not a product id"),
        (["p-404"], "pick 1 (p-404) is not in the week's screened catalogue"),
        # in the source's catalogue, but screened out: its link is not a web link
        (["p-9"], "pick 1 (p-9) is not in the week's screened catalogue"),
        ([product(1, title="Cheaper teapot")], "pick 1 (p-1) is not in the week's screened"),
        (["p-1\r\nBcc: x"], "pick 1 ('p-1\\r\\nBcc: x') is not in the week's screened"),
        (["p-1", "p-3", "p-1"], "pick 3 repeats product p-1"),
        (["p-1", product(1)], "pick 2 repeats product p-1"),
    ],
    ids=[
        "set",
        "str",
        "iterator",
        "none",
        "too-many",
        "not-an-id",
        "unknown",
        "screened-out",
        "altered-product",
        "unprintable-id",
        "repeat",
        "repeat-as-product",
    ],
)
def test_junk_is_rejected_with_a_reason_that_names_no_product_text(answer, reason):
    with pytest.raises(PicksRejected) as rejected:
        checked_picks(request(), answer)

    assert str(rejected.value).startswith(reason)
    assert "Teapot" not in str(rejected.value)
    assert "\n" not in str(rejected.value)


def test_the_built_in_rule_is_pick_products_over_the_weeks_plan():
    r = request(limit=3)

    picked = checked_picks(r, popular_in_your_categories(r))

    assert picked == pick_products(list(BOUGHT), CATALOGUE, POPULARITY, W42, limit=3)
    assert "p-2" not in {p.product_id for p in picked}  # bought


def test_a_rule_cannot_change_what_the_next_customer_is_given():
    r = request()
    with pytest.raises(TypeError):
        r.catalogue["p-1"] = product(1, title="x")  # type: ignore[index]
    with pytest.raises(TypeError):
        r.popularity["p-1"] = 0  # type: ignore[index]
    assert isinstance(r.bought, tuple)
    assert (r.customer_id, r.period) == ("customer-0001", W42)
