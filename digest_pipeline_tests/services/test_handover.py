"""The delivery run's shorter GIL switch interval is the process's only while a run holds it."""

import sys
import threading

import pytest

from digest_pipeline.services.handover import OVERLAP_SWITCH_INTERVAL, prompt_handover


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
