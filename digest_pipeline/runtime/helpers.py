"""Delivery helper processes: one step's due items worked by more than one process at once.

One process composes and records on one core (one GIL). A ledger on a database server hands
its due items to any number of workers (SKIP LOCKED claims, leases, fencing tokens), so each
helper is one more delivery worker with a core of its own, forked for one step and gone with
it (`DIGEST_DELIVERY_PROCESSES`, docs/how-to/tune.md).
"""

import contextlib
import ctypes
import gc
import json
import logging
import os
import random
import select
import signal
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from digest_pipeline.adapters.forkable import recipe_of
from digest_pipeline.domain.errors import (
    BreakerOpen,
    DeliveryHelperFailed,
    DigestError,
    SendingPaused,
    SnapshotTampered,
)
from digest_pipeline.domain.periods import Period
from digest_pipeline.ports import Clock, Composer, Ledger, Mailer
from digest_pipeline.services.deliver import Deliverer, deliver_due
from digest_pipeline.services.logs import item_logger, logger, step_log, step_logger
from digest_pipeline.services.wave import DeliveryReport

#: how often the step's own process looks at `should_continue` while it waits for a helper
_POLL_SECONDS = 0.2
#: The threads Dagster's own processes keep beside a step, which a fork may leave behind.
#: A fork copies only the calling thread, so a lock another thread holds at that moment stays
#: held in the helper forever; these two only ever hold locks of their own objects, which a
#: helper never touches. A run worker (a UI launch) and a multiprocess step process both keep
#: Dagster's `termination-handler`, parked on the run's stop event (it interrupts the step's
#: own thread, never a helper), and multiprocessing's `QueueFeederThread`, which carries their
#: events queue to the process that launched them. A helper never puts on that queue, never
#: logs through Dagster (its handlers are dropped) and leaves by `os._exit`, which skips the
#: queue's finalizer. Any other thread, however idle, keeps the step in one process.
PARKED_THREADS = frozenset({"termination-handler", "QueueFeederThread"})
#: Held while a helper is forked, and by this project's own threads (`digest run`'s progress
#: line) for all the work they do, so a fork never copies that work half done. (A helper's
#: copy of it stays held; nothing in a helper takes it.)
_FORK_LOCK = threading.Lock()
#: this project's threads that work only inside `between_forks` (`allow_forks_beside`)
_BETWEEN_FORKS: "weakref.WeakSet[threading.Thread]" = weakref.WeakSet()


@dataclass(frozen=True)
class _Recipes:
    """How a helper makes its own ports: fresh connections, never the step process's."""

    ledger: Callable[[], Ledger]
    mailer: Callable[[], Mailer]
    composer: Callable[[], Composer]
    clock: Callable[[], Clock]


@dataclass(frozen=True)
class _Share:
    """What one process of the step delivers: the common bounds and its own part."""

    batch_size: int
    concurrency: int
    period: Period | None
    max_items: int | None
    breaker_threshold: int | None


def _recipes(deliverer: Deliverer) -> _Recipes | str:
    """The deliverer's ports as recipes, or why a helper cannot be forked (a `why=` code)."""
    if not hasattr(os, "fork"):
        return "no_fork"
    if busy := running_threads():
        return "threads_running:" + ",".join(busy)
    found = {
        "ledger": recipe_of(deliverer.ledger),
        "mailer": recipe_of(deliverer.mailer),
        "composer": recipe_of(deliverer.composer),
        "clock": recipe_of(deliverer.clock),
    }
    missing = [name for name, recipe in found.items() if recipe is None]
    if missing:
        return "no_recipe:" + ",".join(missing)
    return _Recipes(**found)  # type: ignore[arg-type]


def running_threads() -> list[str]:
    """The names of the threads other than this one that a fork must not leave behind.

    Those are all but Dagster's and multiprocessing's daemon threads in `PARKED_THREADS` and
    this project's threads that work only `between_forks`.
    """
    this = threading.current_thread()
    return sorted(
        t.name
        for t in threading.enumerate()
        if t is not this and t not in _BETWEEN_FORKS and not (t.daemon and t.name in PARKED_THREADS)
    )


@contextlib.contextmanager
def between_forks() -> Iterator[None]:
    """Holds off the forking of helpers while the calling thread does some work.

    A thread that does all its work inside this (and is marked with `allow_forks_beside`) is
    only ever parked when a helper is forked beside it, so it is no reason to deliver alone.
    """
    with _FORK_LOCK:
        yield


def allow_forks_beside(thread: threading.Thread) -> None:
    """Marks `thread` as one that works only `between_forks` (call it before starting it)."""
    _BETWEEN_FORKS.add(thread)


def shares(total: int | None, processes: int) -> list[int | None]:
    """`total` claims split as evenly as they go over `processes` (None: no bound for any)."""
    if total is None:
        return [None] * processes
    return [total // processes + (1 if i < total % processes else 0) for i in range(processes)]


def deliver_in_processes(
    deliverer: Deliverer,
    processes: int,
    *,
    batch_size: int,
    concurrency: int,
    period: Period | None = None,
    max_items: int | None = None,
    should_continue: Callable[[], bool] = lambda: True,
    breaker_threshold: int | None = None,
) -> DeliveryReport:
    """`deliver_due` in this process and in `processes - 1` forked helpers, each with a share.

    Each helper makes its own ports from the deliverer's recipes (its ledger refuses to be
    another database) and runs `deliver_due` with its own owner (`<owner>/p<n>`), breaker and
    share of `max_items`, while this process runs its own. When any of them stops with an
    error, the others are told to stop claiming (they finish the claims they hold); every one
    is waited for, and the error is raised here: a tampered snapshot first, then an open
    breaker, then a helper that failed. With a port that has no recipe (a test's clock, a
    ledger in this process such as SQLite's), or threads running that a fork could leave
    holding a lock (`running_threads`), it is `deliver_due` alone, and a line says why.
    """
    if processes < 1:
        raise ValueError("processes must be at least 1")
    share = _Share(batch_size, concurrency, period, max_items, breaker_threshold)
    recipes = _recipes(deliverer) if processes > 1 else None
    if isinstance(recipes, _Recipes):
        return _with_helpers(deliverer, recipes, processes, share, should_continue)
    if recipes is not None:
        step_log.info("delivery_processes", asked=processes, used=1, why=recipes)
    return _deliver(deliverer, share, should_continue, DeliveryReport())


def _deliver(
    deliverer: Deliverer,
    share: _Share,
    should_continue: Callable[[], bool],
    report: DeliveryReport,
) -> DeliveryReport:
    """`deliver_due` over one process's share, its counts added to `report`."""
    deliver_due(
        deliverer,
        batch_size=share.batch_size,
        concurrency=share.concurrency,
        period=share.period,
        max_items=share.max_items,
        should_continue=should_continue,
        breaker_threshold=share.breaker_threshold,
        report=report,
    )
    return report


def _with_helpers(
    deliverer: Deliverer,
    recipes: _Recipes,
    processes: int,
    share: _Share,
    should_continue: Callable[[], bool],
) -> DeliveryReport:
    """`deliver_in_processes` once the helpers can be forked: fork, deliver, wait, add up."""
    own, *theirs = (replace(share, max_items=n) for n in shares(share.max_items, processes))
    helpers: list[_Helper] = []
    report = DeliveryReport()
    if share.period is not None:
        # checked (and cached) once here rather than by each process after the fork
        deliverer.require_snapshot(share.period)
    try:
        for n, part in enumerate(theirs, 1):
            if part.max_items != 0:
                owner = f"{deliverer.owner}/p{n}"
                helpers.append(_Helper(recipes, deliverer, owner, part, helpers))
        if own.max_items != 0:

            def going() -> bool:
                # a helper's error stops this process's claims too
                return should_continue() and not any(h.failed for h in helpers)

            _deliver(deliverer, own, going, report)
    except BaseException as e:
        for helper in helpers:
            helper.stop()
        found = _collected(helpers, lambda: False, report)
        if isinstance(e, DigestError) and (first := _first([e, *found])) is not e:
            raise first from e  # a helper's tampered snapshot outranks this one's breaker
        raise
    errors = _collected(helpers, should_continue, report)
    step_log.info(
        "delivered_in_processes",
        owner=deliverer.owner,
        processes=1 + len(helpers),
        claimed=report.claimed,
        failed_helpers=len(errors) or None,
    )
    if errors:
        raise _first(errors)
    return report


def _collected(
    helpers: list["_Helper"], should_continue: Callable[[], bool], report: DeliveryReport
) -> list[DigestError]:
    """Waits for every helper, adding its counts to `report`; their errors, in helper order.

    The first error tells the helpers still working to stop claiming.
    """
    errors: list[DigestError] = []
    for helper in helpers:
        helper.wait(should_continue)
        report.add(helper.report)
        if helper.error is not None:
            errors.append(helper.error)
            for other in helpers:
                other.stop()
    return errors


def _first(errors: list[DigestError]) -> DigestError:
    """The error a step reports: a tampered snapshot before an open breaker before the rest."""
    for kind in (SnapshotTampered, BreakerOpen):
        for error in errors:
            if isinstance(error, kind):
                return error
    return errors[0]


class _Helper:
    """One forked helper, seen from the step's process: its report comes back on a pipe.

    The other pipe is the stop signal: closing our end of it tells the helper to stop claiming.
    """

    def __init__(
        self,
        recipes: _Recipes,
        deliverer: Deliverer,
        owner: str,
        share: _Share,
        earlier: list["_Helper"],
    ) -> None:
        self.owner = owner
        self.report = DeliveryReport()
        self.error: DigestError | None = None
        self._done = False
        stop_read, self._stop = os.pipe()
        self._results, result_write = os.pipe()
        parent = os.getpid()
        with _FORK_LOCK:  # never while a thread of ours is half way through its work
            pid = os.fork()
        if pid == 0:  # the helper: never returns
            # Nothing the fork copied is ever collected here: a finalizer of the step
            # process's garbage (a database connection's) would talk on the step's sockets.
            gc.freeze()
            # only its own ends: an earlier helper's stop pipe held open here would never
            # reach that helper as closed
            for fd in (self._stop, self._results, *(f for h in earlier for f in h.fds)):
                with contextlib.suppress(OSError):
                    os.close(fd)
            _helper(recipes, deliverer, owner, share, parent, stop_read, result_write)
        os.close(stop_read)
        os.close(result_write)
        self._pid = pid

    @property
    def fds(self) -> tuple[int, ...]:
        """This process's ends of its pipes, while open."""
        return tuple(fd for fd in (self._stop, -1 if self._done else self._results) if fd >= 0)

    @property
    def failed(self) -> bool:
        """Whether it has ended with an error (looked at without waiting)."""
        if not self._done and select.select([self._results], [], [], 0)[0]:
            self.wait(lambda: True)
        return self.error is not None

    def stop(self) -> None:
        """Asks it to stop claiming; it finishes the claims it holds, then reports."""
        if self._stop >= 0:
            os.close(self._stop)
            self._stop = -1

    def wait(self, should_continue: Callable[[], bool]) -> None:
        """Waits for it to end, asking it to stop once `should_continue` says no.

        Its counts are then in `report`, and its error, if any, in `error`; a helper that ended
        without its report (killed, or crashed before it could write it) is an error.
        """
        if self._done:
            return
        while not select.select([self._results], [], [], _POLL_SECONDS)[0]:
            if not should_continue():
                self.stop()
        with os.fdopen(self._results, "rb") as results:
            out = results.read()
        _, status = os.waitpid(self._pid, 0)
        self.stop()
        self._done = True
        try:
            result = json.loads(out)
        except ValueError:
            self.error = DeliveryHelperFailed(
                f"delivery helper {self.owner} ended ({_status(status)}) without its report; "
                "the claims it held come back due when their leases expire"
            )
            return
        self.report = DeliveryReport(
            claimed=result["claimed"],
            lost_races=result["lost_races"],
            released=result["released"],
            suppressed=result["suppressed"],
        )
        self.report.outcomes.update(result["outcomes"])
        self.error = _error_of(result["error"])


def _status(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"exit code {os.WEXITSTATUS(status)}"


def _error_of(raw: dict[str, Any] | None) -> DigestError | None:
    if raw is None:
        return None
    message = raw["message"]
    if raw["kind"] == "SnapshotTampered":
        return SnapshotTampered(message, raw["period"] or "")
    if raw["kind"] == "SendingPaused":
        return SendingPaused(message)
    if raw["kind"] == "BreakerOpen":
        return BreakerOpen(message)
    return DeliveryHelperFailed(message)


def _error_record(e: BaseException, owner: str) -> dict[str, Any]:
    if isinstance(e, (SnapshotTampered, BreakerOpen)):
        return {"kind": type(e).__name__, "message": str(e), "period": getattr(e, "period", None)}
    return {"kind": "failed", "message": f"delivery helper {owner}: {type(e).__name__}: {e}"}


def _die_with_parent(parent: int) -> None:
    """Ends this process when the step's process ends, however it ends (Linux' PDEATHSIG).

    A helper left behind would keep claiming after its step was killed; its work would still
    be fenced, but a killed step must stop sending. Elsewhere the closed stop pipe stops it at
    its next claim.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


def _quiet_logging() -> None:
    """Drops the log handlers the fork copied; a helper's warnings and worse go to stderr.

    The step's handlers (Dagster's) write to its storage over the step process's connections.
    """
    for copied in (logging.getLogger(), logger, step_logger, item_logger):
        copied.handlers.clear()
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    logger.addHandler(handler)
    logger.propagate = False


def _helper(
    recipes: _Recipes,
    deliverer: Deliverer,
    owner: str,
    share: _Share,
    parent: int,
    stop: int,
    results: int,
) -> None:
    """A helper's life: its own ports, its share delivered, one JSON report line, `_exit`.

    `os._exit`, never a return or `sys.exit`: the step process's objects (its database
    connections, Dagster's) must not be closed or flushed from here.
    """
    code = 0
    try:
        _die_with_parent(parent)
        _quiet_logging()
        report = DeliveryReport()
        error: dict[str, Any] | None = None
        mailer: Mailer | None = None
        try:
            mailer = recipes.mailer()
            # the step process's worker on this process's own ports; its snapshot verdicts
            # (each trusted for a lease at most) come along, so no helper reads the snapshot
            # whole again
            mine = replace(
                deliverer,
                ledger=recipes.ledger(),
                mailer=mailer,
                composer=recipes.composer(),
                clock=recipes.clock(),
                rand=random.Random().random,
                owner=owner,
            )
            # the step's process closes the pipe to stop us (or it died): readable at EOF
            _deliver(mine, share, lambda: not select.select([stop], [], [], 0)[0], report)
        except Exception as e:
            error = _error_record(e, owner)
        finally:
            if mailer is not None:
                mailer.close()
        line = {
            "claimed": report.claimed,
            "outcomes": dict(report.outcomes),
            "lost_races": report.lost_races,
            "released": report.released,
            "suppressed": report.suppressed,
            "error": error,
        }
        with os.fdopen(results, "w", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")
    except BaseException:
        code = 1
    finally:
        os._exit(code)
