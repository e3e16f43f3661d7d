"""Process settings a bulk run changes while it lasts: the GIL switch interval and the collector.

Both are process-wide, so runs that overlap in one process (threads, the in-process executor)
share them: each setting is counted, applied by the first run in and restored by the last out.
The first bulk run in a process also freezes the heap it finds there, once (`fewer_collections`).
"""

import functools
import gc
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Generic, TypeVar, cast

#: seconds; a tenth of CPython's default, so the ledger thread gets the GIL back soon after
#: each statement
OVERLAP_SWITCH_INTERVAL = 0.0005
#: allocations between young collections during a bulk run (CPython's default is 700)
BULK_GC_THRESHOLD = 10_000

T = TypeVar("T")


class _Counted(Generic[T]):
    """A process setting held by blocks: `apply` returns what `restore` puts back after the last."""

    def __init__(self, apply: Callable[[], T], restore: Callable[[T], None]) -> None:
        self._apply = apply
        self._restore = restore
        self._lock = threading.Lock()
        self._holders = 0
        self._saved: T | None = None

    @contextmanager
    def held(self) -> Iterator[None]:
        with self._lock:
            if self._holders == 0:
                self._saved = self._apply()
            self._holders += 1
        try:
            yield
        finally:
            with self._lock:
                self._holders -= 1
                if self._holders == 0:
                    self._restore(cast(T, self._saved))


def _shorten_interval() -> float:
    saved = sys.getswitchinterval()
    sys.setswitchinterval(min(saved, OVERLAP_SWITCH_INTERVAL))
    return saved


@functools.cache  # once a process; a forked child inherits it, with its parent's frozen heap
def _freeze_startup_heap() -> None:
    # a flag, not gc.get_freeze_count(): that one walks every frozen object on each call
    gc.freeze()


def _raise_threshold() -> tuple[int, int, int]:
    saved = gc.get_threshold()
    if saved[0] > 0:  # 0 means the process disabled automatic collection: left so
        _freeze_startup_heap()
        gc.set_threshold(max(saved[0], BULK_GC_THRESHOLD), *saved[1:])
    return saved


_interval = _Counted(_shorten_interval, sys.setswitchinterval)
_collector = _Counted(_raise_threshold, lambda saved: gc.set_threshold(*saved))


def prompt_handover() -> AbstractContextManager[None]:
    """A shorter GIL switch interval, for a run that overlaps its ledger calls with composing.

    The ledger thread needs the GIL for a moment after each statement returns; with the
    composing thread holding it, CPython hands it over only every `sys.getswitchinterval()`
    (5 ms by default), several times per wave.
    """
    return _interval.held()


def fewer_collections() -> AbstractContextManager[None]:
    """Young collections every `BULK_GC_THRESHOLD` allocations instead of 700.

    A bulk run keeps a chunk or a wave of objects alive for a moment; at 700 they outlive
    several young collections, get promoted, and trigger full collections that walk the whole
    heap (Dagster's included).

    The first one in a process also moves every object alive then (Dagster's modules, the loaded
    definitions, about 250,000 objects) out of the collector's sight for good (`gc.freeze`), so
    a full collection walks the run's objects only. Once only, so
    what it keeps is bounded: a cycle that is already garbage at that moment is never
    collected; refcounting still frees every other frozen object that dies.
    """
    return _collector.held()
