"""Writes in flight: never more than the limit, answers in order, nothing left running on error."""

import threading
import time

import pytest

from digest_pipeline.runtime.overlap import overlapped_writes


class Recorder:
    """A write that records how many run at once (under its lock) and can fail on one value."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.lock = threading.Lock()
        self.running = self.most = 0
        self.ended: list[int] = []
        self.threads: set[int] = set()
        self.fail_on = fail_on

    def write(self, n: int) -> int:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.threads.add(threading.get_ident())
        try:
            time.sleep(0.005 * (n % 3))  # later writes may end first; answers stay in order
            if n == self.fail_on:
                raise RuntimeError(f"write {n} failed")
            return n * 10
        finally:
            with self.lock:
                self.running -= 1
                self.ended.append(n)


@pytest.mark.parametrize("limit", [1, 2, 4])
def test_answers_come_in_submission_order_and_never_more_than_the_limit_run(limit):
    recorder, answers = Recorder(), list[int]()

    with overlapped_writes(limit, True, "test") as writes:
        for n in range(12):
            writes.submit(answers.append, recorder.write, n)

    assert answers == [n * 10 for n in range(12)]
    with recorder.lock:
        assert 1 <= recorder.most <= limit
        assert recorder.running == 0
        assert threading.get_ident() not in recorder.threads


def test_without_overlap_each_write_runs_here_and_is_answered_before_the_next():
    recorder, answers = Recorder(), list[int]()

    with overlapped_writes(2, False, "test") as writes:
        for n in range(5):
            writes.submit(answers.append, recorder.write, n)
            assert answers[-1] == n * 10

    assert recorder.threads == {threading.get_ident()}


def _write_ten(recorder: Recorder, answers: list[int]) -> None:
    with overlapped_writes(2, True, "test") as writes:
        for n in range(10):
            writes.submit(answers.append, recorder.write, n)


def test_a_failed_write_is_raised_here_only_after_every_write_in_flight_ended():
    recorder, answers = Recorder(fail_on=3), list[int]()

    with pytest.raises(RuntimeError, match="write 3 failed"):
        _write_ten(recorder, answers)

    assert answers == [0, 10, 20]
    with recorder.lock:
        assert recorder.running == 0
        # the write started after 3 (the limit allows one more) ended before the raise
        assert 4 in recorder.ended
        assert max(recorder.ended) <= 4


def test_a_limit_below_one_is_refused():
    with pytest.raises(ValueError, match="at least 1"), overlapped_writes(0, True, "test"):
        pass
