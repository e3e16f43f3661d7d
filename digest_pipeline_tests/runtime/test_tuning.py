"""A bulk run's process settings (switch interval, collector) hold only while a run holds them.

The one lasting change, the heap frozen by a process's first bulk run, happens once a process.
"""

import gc
import json
import subprocess
import sys
import textwrap
import threading
from datetime import timedelta
from typing import Any

import pytest

from digest_pipeline.domain.catalogue import Product
from digest_pipeline.domain.model import CleanupMode
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.runtime.executor import executor_for
from digest_pipeline.runtime.tuning import (
    BULK_GC_THRESHOLD,
    OVERLAP_SWITCH_INTERVAL,
    fewer_collections,
    prompt_handover,
)
from digest_pipeline.services.cleanup import clean_period
from digest_pipeline.services.content import generate_content
from digest_pipeline.services.deliver import deliver_due
from digest_pipeline.services.enqueue import enqueue_period
from digest_pipeline.services.snapshot import take_snapshot
from digest_pipeline_tests.builders import make_customer, make_deliverer
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.fakes import FakeCustomerSource, FakeLedger, FakeMailer


def _failing_run(seen: list[float]) -> None:
    with prompt_handover():
        seen.append(sys.getswitchinterval())
        raise RuntimeError("the run failed")


def test_the_interval_is_short_inside_and_restored_after_even_on_error():
    before = sys.getswitchinterval()
    seen: list[float] = []
    with pytest.raises(RuntimeError):
        _failing_run(seen)
    assert seen == [pytest.approx(OVERLAP_SWITCH_INTERVAL)]
    assert sys.getswitchinterval() == before


def test_overlapping_runs_restore_the_interval_only_when_the_last_one_ends():
    before = sys.getswitchinterval()
    first_in, second_done, first_may_end = threading.Event(), threading.Event(), threading.Event()
    seen: list[float] = []

    def first() -> None:
        with prompt_handover():
            first_in.set()
            first_may_end.wait(10)

    def second() -> None:
        first_in.wait(10)
        with prompt_handover():
            pass
        # the first run still holds it: ending the second must not restore the interval
        seen.append(sys.getswitchinterval())
        second_done.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    second_done.wait(10)
    first_may_end.set()
    for t in threads:
        t.join(10)
    assert seen == [pytest.approx(OVERLAP_SWITCH_INTERVAL)]
    assert sys.getswitchinterval() == before


def test_a_shorter_interval_set_by_the_process_is_kept():
    before = sys.getswitchinterval()
    sys.setswitchinterval(OVERLAP_SWITCH_INTERVAL / 2)
    try:
        with prompt_handover():
            assert sys.getswitchinterval() == pytest.approx(OVERLAP_SWITCH_INTERVAL / 2)
        assert sys.getswitchinterval() == pytest.approx(OVERLAP_SWITCH_INTERVAL / 2)
    finally:
        sys.setswitchinterval(before)


def test_a_bulk_run_collects_less_often_and_the_threshold_is_restored_even_on_error():
    before = gc.get_threshold()
    seen: list[tuple[int, int, int]] = []

    def failing_run() -> None:
        with fewer_collections():
            seen.append(gc.get_threshold())
            raise RuntimeError("the run failed")

    with pytest.raises(RuntimeError):
        failing_run()
    assert seen == [(max(before[0], BULK_GC_THRESHOLD), *before[1:])]
    assert gc.get_threshold() == before


def test_nested_bulk_runs_restore_the_threshold_only_when_the_outer_one_ends():
    before = gc.get_threshold()
    with fewer_collections():
        with fewer_collections():
            pass
        assert gc.get_threshold()[0] >= BULK_GC_THRESHOLD
    assert gc.get_threshold() == before


@pytest.mark.parametrize("threshold", [0, BULK_GC_THRESHOLD * 2])
def test_a_process_that_disabled_collection_or_collects_less_already_is_left_so(threshold):
    before = gc.get_threshold()
    gc.set_threshold(threshold, *before[1:])
    try:
        with fewer_collections():
            assert gc.get_threshold()[0] == threshold
        assert gc.get_threshold()[0] == threshold
    finally:
        gc.set_threshold(*before)


#: run in a fresh interpreter: the freeze happens once a process, and pytest's may have done it
_FREEZE_PROBE = textwrap.dedent(
    """
    import gc, json, sys, weakref
    from digest_pipeline.runtime.tuning import fewer_collections

    class Box:
        pass

    def listed(obj):  # the collector's generations; frozen objects are in none of them
        return any(o is obj for o in gc.get_objects())

    if sys.argv[1] == "disabled":
        gc.set_threshold(0)
    startup, dying = [Box()], Box()
    gone = weakref.ref(dying)
    with fewer_collections():
        pass
    after_first = gc.get_freeze_count()
    later = [Box()]
    with fewer_collections():
        pass
    del dying
    print(json.dumps({
        "startup_listed": listed(startup),
        "later_listed": listed(later),
        "after_first": after_first,
        "after_second": gc.get_freeze_count(),
        "dead_frozen_freed": gone() is None,
    }))
    """
)


def _probe(mode: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", _FREEZE_PROBE, mode], capture_output=True, text=True, check=True
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_the_first_bulk_run_in_a_process_freezes_the_heap_it_finds_and_later_runs_do_not():
    seen = _probe("enabled")
    # what lived before the first run is out of the collector's walks for good...
    assert seen["startup_listed"] is False
    assert seen["after_first"] > 0
    # ...but only once: a later run's objects stay collectable, so what is kept is bounded
    # (the frozen count can only fall, as frozen objects die)
    assert seen["later_listed"] is True
    assert seen["after_second"] <= seen["after_first"]
    # and a frozen object that dies is still freed by its reference count
    assert seen["dead_frozen_freed"] is True


def test_a_process_that_disabled_collection_gets_no_freeze_either():
    seen = _probe("disabled")
    assert seen["after_first"] == seen["after_second"] == 0
    assert seen["startup_listed"] is True


class _WatchedLedger(FakeLedger):
    """Notes the collector's threshold each time a bulk write reaches the ledger."""

    BULK = ("freeze_snapshot", "add_digest_rows", "record_and_start", "clean_many")

    def __init__(self) -> None:
        super().__init__()
        self.thresholds: dict[str, set[int]] = {}

    def __getattribute__(self, name: str) -> Any:
        if name in _WatchedLedger.BULK:
            self.thresholds.setdefault(name, set()).add(gc.get_threshold()[0])
        return super().__getattribute__(name)


def test_a_week_through_the_services_writes_in_bulk_with_the_raised_threshold_only(clock):
    before = gc.get_threshold()
    # new arrivals of the week: every customer gets picks without any order history
    products = [
        Product(
            f"p-{n}",
            f"Product {n}",
            "Kitchen",
            1990,
            "EUR",
            f"https://shop.example/p/{n}",
            None,
            W42.starts_at + timedelta(days=1),
        )
        for n in range(4)
    ]
    source = FakeCustomerSource([make_customer(n) for n in range(1, 6)], products, [])
    ledger = _WatchedLedger()

    # the runtime's executor, as the faces hand it to the services
    run = executor_for(ledger)
    take_snapshot(source, ledger, clock, W42, "run-1", executor=run)
    generate_content(source, ledger, W42, executor=run)
    enqueue_period(ledger, clock, W42)
    deliver_due(make_deliverer(ledger, FakeMailer(clock=clock), clock), batch_size=2, concurrency=2)
    clean_period(ledger, clock, W42, CleanupMode.ARCHIVE, executor=run)

    raised = max(before[0], BULK_GC_THRESHOLD)
    assert ledger.thresholds == {name: {raised} for name in _WatchedLedger.BULK}
    assert ledger.state_counts(W42) == {DeliveryState.CLEANED: 5}
    assert gc.get_threshold() == before
