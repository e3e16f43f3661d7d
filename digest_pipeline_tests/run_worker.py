"""The threads a Dagster run worker keeps beside its steps, started here for tests.

A UI launch runs the job in a run worker process, and a multiprocess or Celery step runs in a
step process; beside the step's own thread each keeps Dagster's termination handler and a
multiprocessing queue's feeder (seen in a UI launch on Dagster 1.13.27). Delivery helpers are
forked beside them, so tests that fork helpers start the same two threads.
"""

import multiprocessing
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from digest_pipeline.dagster_private import start_termination_thread


@contextmanager
def run_worker_threads() -> Iterator[set[str]]:
    """Dagster's `termination-handler` and a fed queue's `QueueFeederThread`, while inside.

    Yields the names of the threads it started; both are gone again on the way out.
    """
    before = set(threading.enumerate())
    should_stop, is_done = multiprocessing.Event(), multiprocessing.Event()
    # annotated as threading's Events, but it checks for multiprocessing's, as a run worker's are
    start_termination_thread(should_stop, is_done)  # type: ignore[arg-type]
    events: multiprocessing.Queue[str] = multiprocessing.Queue()
    events.put("started")  # the feeder thread starts with the first put
    started = [t for t in threading.enumerate() if t not in before]
    try:
        yield {t.name for t in started}
    finally:
        # done before stop: the handler then leaves without interrupting this thread
        is_done.set()
        should_stop.set()
        events.get()
        events.close()
        events.join_thread()
        for thread in started:
            thread.join()
