"""The composer checks each distinct product row once per process: a cached pick must be exactly
what checking that row afresh gives, and a refusal must name the row it came from."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from digest_pipeline.adapters.mail import render
from digest_pipeline.domain.errors import RenderError
from digest_pipeline.domain.model import DigestRow
from digest_pipeline_tests.builders import key_of

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 100),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(
        [
            "",
            "19.90",
            "1",
            "1.0",
            "EUR",
            "usd",
            "Walnut board",
            "https://shop.example/p/1",
            "javascript:alert(1)",
            "https://cdn.shop.example/i.jpg",
        ]
    ),
)
fields = st.fixed_dictionaries({f: scalars for f in render._PICK_FIELDS})


def fresh(payload: dict[str, object]) -> object:
    try:
        return render._checked_pick(*(payload[f] for f in render._PICK_FIELDS))
    except render._Problem as e:
        return ("refused", str(e))


@given(st.lists(fields, min_size=1, max_size=6))
def test_a_cached_pick_is_what_a_fresh_check_of_the_same_row_gives(payloads):
    for n, payload in enumerate(payloads):
        key, row = key_of(n + 1), DigestRow(key_of(n + 1), n, payload)
        expected = fresh(payload)
        # twice: the second answer may come from the cache
        for _ in range(2):
            if isinstance(expected, tuple):
                refusal = f"{key}: digest row {n} (no product id) {expected[1]}"
                with pytest.raises(RenderError) as caught:
                    render.pick_of(key, row)
                assert str(caught.value) == refusal
            else:
                assert render.pick_of(key, row) == expected, payload


def test_a_refusal_is_raised_again_with_each_rows_own_name():
    bad: dict[str, object] = {
        "title": "Board",
        "url": "javascript:alert(1)",
        "product_id": "prod-0001",
    }
    for n in (1, 2):
        with pytest.raises(
            RenderError,
            match=f"customer-000{n}: digest row 0 \\(product prod-0001\\) has an invalid url",
        ):
            render.pick_of(key_of(n), DigestRow(key_of(n), 0, bad))
