"""One way to cut a stream into lists of at most n items (itertools.batched is Python 3.12).

The ledger's IN lists, the content generator's customer chunks, cleanup's pages and delivery's
waves all bound their memory and statement sizes with it.
"""

from collections.abc import Iterable, Iterator
from itertools import islice
from typing import TypeVar

T = TypeVar("T")


def chunked(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Consecutive lists of `size` items (the last may be shorter); nothing for no items."""
    if size < 1:
        raise ValueError(f"size must be at least 1, got {size}")
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk
