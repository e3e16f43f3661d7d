"""Writes to a database server kept in flight while the caller prepares the next one.

A phase that reads and computes in Python, then hands a chunk to one ledger transaction
(content, cleanup) leaves the server idle while it computes and itself idle while the server
writes. Over a server the writes run on a few threads, their answers taken in order; on SQLite,
whose work is this process's own CPU, each write is simply waited for.
"""

from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from digest_pipeline.services.executor import WritesInTurn

T = TypeVar("T")


class Writes:
    """Runs writes on `pool`, at most `limit` at a time; each one's `then` gets its answer, in order."""

    def __init__(self, pool: ThreadPoolExecutor, limit: int) -> None:
        self._pool = pool
        self._limit = limit
        self._pending: deque[tuple[Future[Any], Callable[[Any], None]]] = deque()

    def submit(self, then: Callable[[T], None], write: Callable[..., T], *args: Any) -> None:
        """Starts `write(*args)`; first takes the oldest answer if `limit` are in flight."""
        if len(self._pending) == self._limit:
            self._take_oldest()
        self._pending.append((self._pool.submit(write, *args), then))

    def drain(self) -> None:
        """Takes every answer still to come, in order."""
        while self._pending:
            self._take_oldest()

    def _take_oldest(self) -> None:
        future, then = self._pending.popleft()
        then(future.result())


@contextmanager
def overlapped_writes(limit: int, overlap: bool, name: str) -> Iterator[Writes | WritesInTurn]:
    """Writes for the block: in flight on `limit` threads when `overlap`, else one by one.

    Every answer is taken by the block's end. A block that raises (a write's error, raised by
    `submit` or `drain` in the caller's thread, included) ends only once every write it started
    has ended, so nothing of the phase still runs behind its caller's back.
    """
    if limit < 1:
        raise ValueError("limit must be at least 1")
    if not overlap:
        yield WritesInTurn()
        return
    with ThreadPoolExecutor(limit, name) as pool:
        writes = Writes(pool, limit)
        yield writes
        writes.drain()
