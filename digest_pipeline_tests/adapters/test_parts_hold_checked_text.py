"""Compose checks the headers only: a part can hold no text UTF-8 cannot encode.

`Jinja2Composer.compose` no longer encodes both parts of every message; each value the parts
show is checked as it comes in (a pick's fields, the customer's name, the shop's name). The
property: whatever the payload and the shop's name hold, compose either refuses with a
RenderError or gives a message the full gate (`check_message`, the parts included) passes.
"""

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from digest_pipeline.adapters.mail.mime import check_message
from digest_pipeline.adapters.mail.render import Jinja2Composer
from digest_pipeline.domain.errors import RenderError
from digest_pipeline_tests.adapters.test_render import (
    RECIPIENT,
    UNSUBSCRIBE,
    item_for,
    picks,
    product,
)
from digest_pipeline_tests.conftest import T0
from digest_pipeline_tests.fakes import FixedClock

#: text as a badly decoded source may hand it over: lone surrogates among ordinary characters
_TEXT = st.text(
    alphabet=st.sampled_from([*"aZ9 .-€é…<&\"'", "\ud800", "\udfff", "\udc80"]), max_size=12
)
_FIELDS = ("title", "price", "currency", "url", "image_url", "customer_name")


def _composer(shop_name: str = "Example Shop") -> Jinja2Composer:
    return Jinja2Composer(
        sender="digest@example.com",
        unsubscribe_url=UNSUBSCRIBE,
        unsubscribe_secret="s3cret",
        clock=FixedClock(T0),
        shop_name=shop_name,
    )


#: one field of a pick overridden: a link keeps its scheme and host, so the text is what is odd
_OVERRIDE = st.tuples(st.sampled_from(_FIELDS), _TEXT).map(
    lambda f: {f[0]: "https://shop.example/" + f[1] if f[0].endswith("url") else f[1]}
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_OVERRIDE, min_size=1, max_size=3), _TEXT)
def test_a_composed_message_passes_the_gate_that_checks_the_parts(
    overrides: list[dict[str, Any]], shop_name: str
) -> None:
    item = item_for()
    rows = picks(item.key, *(product(n) | o for n, o in enumerate(overrides, 1)))
    try:
        message = _composer(shop_name or "Example Shop").compose(item, RECIPIENT, rows)
    except RenderError:
        return
    check_message(message)


@pytest.mark.parametrize("shop_name", ["Tea \ud800 shop", "\udfff"])
def test_a_shop_name_utf8_cannot_encode_refuses_every_item(shop_name: str) -> None:
    subject = _composer(shop_name)
    for customer_id in ("customer-0001", "customer-0002"):
        item = item_for(customer_id)
        with pytest.raises(RenderError, match="shop name is not valid Unicode"):
            subject.compose(item, RECIPIENT, picks(item.key, product(1)))
