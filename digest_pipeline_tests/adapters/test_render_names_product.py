"""A refused pick is named by row, product id and field: never by its value or the address."""

import pytest

from digest_pipeline.domain.errors import RenderError
from digest_pipeline_tests.adapters.test_render import RECIPIENT, compose, product

KEY = "digest:2026-W42:customer-0001"


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        pytest.param(
            {"image_url": 'https://cdn.shop.example/p/1.jpg" onerror="alert(1)'},
            "has an invalid image_url",
            id="quoted-image",
        ),
        pytest.param({"url": "javascript:alert(1)"}, "has an invalid url", id="script-url"),
        pytest.param({"url": None}, "lacks a url", id="no-url"),
        pytest.param({"title": ""}, "lacks a title", id="no-title"),
        pytest.param({"price": "twelve"}, "has an invalid price", id="price"),
        pytest.param({"currency": "EURO"}, "has an invalid currency", id="currency"),
        pytest.param(
            {"url": "https://shop.example/p/\ud800"},
            "has a url that is not valid Unicode",
            id="surrogate-url",
        ),
    ],
)
def test_the_refusal_names_the_row_the_product_and_the_field(overrides, says):
    with pytest.raises(RenderError) as refused:
        compose(product(1, product_id="prod-0042"), product(2, product_id="prod-0007", **overrides))

    assert str(refused.value) == f"{KEY}: digest row 1 (product prod-0007) {says}"
    for secret in ("onerror", "javascript", "cdn.shop.example", "shop.example", RECIPIENT):
        assert secret not in str(refused.value)


def test_a_row_without_a_product_id_is_named_by_position():
    with pytest.raises(RenderError) as refused:
        compose(product(1, url="ftp://shop.example/p/1"))

    assert str(refused.value) == f"{KEY}: digest row 0 (no product id) has an invalid url"


def test_an_unprintable_product_id_is_shown_inert():
    with pytest.raises(RenderError) as refused:
        compose(product(1, product_id="p\r\nBcc: x", title=""))

    assert "\n" not in str(refused.value)
    assert "(product 'p\\r\\nBcc: x') lacks a title" in str(refused.value)
