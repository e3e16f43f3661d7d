"""Which catalogue products a digest can carry, and that the picks never hold any other."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

import pytest

from digest_pipeline.domain.catalogue import (
    Order,
    PickPlan,
    Product,
    ProductProblem,
    product_problems,
    screen_catalogue,
    shown_id,
)
from digest_pipeline_tests.conftest import W42

OLD = W42.starts_at - timedelta(days=200)


def product(product_id: str = "prod-0001", **overrides: object) -> Product:
    good = Product(
        product_id,
        "Walnut Chopping Board",
        "Kitchen",
        2499,
        "EUR",
        "https://shop.example/p/walnut-board",
        "https://cdn.shop.example/img/walnut-board.jpg",
        OLD,
    )
    return replace(good, **overrides)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({}, id="as-the-demo-shop-lists-it"),
        pytest.param({"image_url": None}, id="no-image"),
        pytest.param({"image_url": ""}, id="empty-image"),
        pytest.param({"url": "http://shop.example:8080/p/1?ref=digest#top"}, id="port-query"),
        pytest.param({"url": "https://shop.example/p/caf%C3%A9"}, id="percent-encoded"),
        pytest.param({"title": "<b>Salt & Pepper</b> \u00e9t\u00e9"}, id="html-and-accents"),
        pytest.param({"price_cents": 0}, id="free"),
        pytest.param({"currency": "chf"}, id="lower-case-currency"),
        pytest.param({"created_at": datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=2)))}),
        pytest.param({"product_id": "SKU:12/blue+xl"}, id="punctuated-id"),
    ],
)
def test_a_good_product_has_no_problems(overrides):
    assert product_problems(product(**overrides)) == ()


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        # links: a quote or space breaks out of the HTML attribute; other schemes run script
        ({"image_url": 'https://cdn.shop.example/x.jpg" onerror="alert(1)'}, "image_url"),
        ({"image_url": '"https://cdn.shop.example/x.jpg"'}, "image_url"),
        ({"image_url": "https://cdn.shop.example/it's.jpg"}, "image_url"),
        ({"image_url": "https://cdn.shop.example/a b.jpg"}, "image_url"),
        ({"image_url": "//cdn.shop.example/x.jpg"}, "image_url"),
        ({"url": "javascript:alert(1)"}, "url"),
        ({"url": "/p/1"}, "url"),
        ({"url": ""}, "url"),
        ({"url": "https://shop.example@evil.example/p/1"}, "url"),
        ({"url": "https://shop.example/p/1\r\nBcc: x@evil.example"}, "url"),
        ({"url": "https://shop.example\\@evil.example/"}, "url"),
        ({"url": "https://shop.example:99999/p/1"}, "url"),
        ({"url": "https://[::1/p/1"}, "url"),
        ({"url": "https://shop.example/<script>"}, "url"),
        ({"url": "https://shop.example/\ud800"}, "url"),
        ({"url": "https://shop.example/" + "p" * 500}, "url"),
        # the title: shown in the subject and both parts
        ({"title": ""}, "title"),
        ({"title": "   "}, "title"),
        ({"title": "Tea\r\nBcc: x@evil.example"}, "title"),
        ({"title": "Tea\u2028Pot"}, "title"),
        ({"title": "Tea\x00"}, "title"),
        ({"title": "Tea \udfff"}, "title"),
        ({"title": "x" * 301}, "title"),
        # money
        ({"price_cents": -1}, "price_cents"),
        ({"price_cents": 10_000_000_001}, "price_cents"),
        ({"price_cents": 12.5}, "price_cents"),
        ({"price_cents": True}, "price_cents"),
        ({"currency": "EURO"}, "currency"),
        ({"currency": "E1R"}, "currency"),
        ({"currency": ""}, "currency"),
        # a naive time cannot be compared with the week's bounds
        ({"created_at": datetime(2026, 1, 1)}, "created_at"),  # noqa: DTZ001
        ({"product_id": "prod 1"}, "product_id"),
        ({"product_id": ""}, "product_id"),
        ({"product_id": "p" * 65}, "product_id"),
    ],
)
def test_a_bad_field_is_named(overrides, field):
    assert product_problems(product(**overrides)) == (field,)


def test_every_failing_field_is_named_in_field_order():
    bad = product(title="", url="ftp://shop.example/", image_url="x", price_cents=-5)

    assert product_problems(bad) == ("title", "price_cents", "url", "image_url")


def test_the_screen_keeps_good_products_and_reports_the_others_by_id():
    good = product("prod-0001")
    quoted = product("prod-0002", image_url='https://cdn.example/"x".jpg')
    untitled = product("prod-0003", title="")

    kept, excluded = screen_catalogue([untitled, good, quoted])

    assert kept == {"prod-0001": good}
    assert excluded == (
        ProductProblem("prod-0002", ("image_url",)),
        ProductProblem("prod-0003", ("title",)),
    )


def test_an_unprintable_id_is_reported_in_an_inert_form():
    [problem] = screen_catalogue([product("prod\r\n1")])[1]

    assert problem == ProductProblem("'prod\\r\\n1'", ("product_id",))
    assert shown_id("p" * 200) == ascii("p" * 200)[:64]
    assert shown_id("prod-0001") == "prod-0001"


def test_a_bad_product_is_never_picked_but_still_names_a_bought_category():
    best = product("prod-0001", category="Garden", image_url='x" onerror="y')
    garden = product("prod-0002", category="Garden")
    kitchen = product("prod-0003", category="Kitchen")
    products = {p.product_id: p for p in (best, garden, kitchen)}
    popularity = {"prod-0001": 9, "prod-0002": 2, "prod-0003": 5}
    plan = PickPlan(products, popularity, W42)
    bought = [Order("o-1", "customer-0001", "prod-0001", datetime(2026, 10, 1, tzinfo=UTC))]

    assert [p.product_id for p in plan.picks(bought)] == ["prod-0002", "prod-0003"]
    assert [p.product_id for p in plan.picks([])] == ["prod-0003", "prod-0002"]
    assert plan.excluded == (ProductProblem("prod-0001", ("image_url",)),)
