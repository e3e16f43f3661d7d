"""`chunked`: every item once, in order, in lists of at most n."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from digest_pipeline.domain.chunks import chunked


@given(st.lists(st.integers()), st.integers(1, 20))
def test_chunks_keep_every_item_once_in_order_and_never_exceed_the_size(items, size):
    chunks = list(chunked(iter(items), size))

    assert [x for c in chunks for x in c] == items
    assert all(1 <= len(c) <= size for c in chunks)
    assert all(len(c) == size for c in chunks[:-1])


@pytest.mark.parametrize("size", [0, -1])
def test_a_size_below_one_is_refused(size):
    with pytest.raises(ValueError, match="at least 1"):
        list(chunked([1, 2], size))
