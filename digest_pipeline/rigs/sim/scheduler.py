"""A deterministic discrete-event scheduler on virtual time.

Actors (delivery workers) are threads, but exactly one of them runs at a time: the scheduler
hands a baton to the actor whose event comes next in (virtual time, sequence) order, and waits
until that actor hands it back by sleeping or parking. The real services therefore run unchanged
(a send can still be in flight while another actor's lease recovery runs), no two threads ever
race, and a seed replays the same interleaving every time. Callbacks (the sweep, lease recovery)
run on the scheduler's own thread and must not sleep.
"""

import heapq
import itertools
import threading
from collections.abc import Callable
from datetime import datetime, timedelta

from digest_pipeline.ports import Clock
from digest_pipeline.rigs.sim.clock import VirtualClock


class SimStopped(BaseException):
    """Raised inside an actor that is waiting, or whose process died, when it is told to stop.

    A `BaseException`, like a killed process: the services' `except Exception` cannot catch it.
    """


class Actor:
    """One simulated thread of control (a worker process, a redelivered task)."""

    def __init__(self, name: str) -> None:
        self.name = name
        #: set when the actor's process died; its clock then refuses to answer
        self.crashed = False
        self.stopping = False
        self.finished = False
        self._go = threading.Semaphore(0)
        self._thread: threading.Thread | None = None


class ActorClock(Clock):
    """An actor's view of the virtual clock; it raises once that actor has died or is stopping.

    `deliver_due` keeps handing claims of a crashed worker to its thread pool: each then stops at
    its first `now()`, before any ledger call, as it would in a dead process.
    """

    def __init__(self, actor: Actor, clock: VirtualClock) -> None:
        self._actor = actor
        self._clock = clock

    def now(self) -> datetime:
        if self._actor.stopping or self._actor.crashed:
            raise SimStopped(f"{self._actor.name} is not running")
        return self._clock.now()


Event = Callable[[], object] | Actor


class Scheduler:
    """Runs callbacks and actors in (virtual time, sequence) order on one baton."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self._queue: list[tuple[datetime, int, Event]] = []
        self._seq = itertools.count()
        self._back = threading.Semaphore(0)
        self._current: Actor | None = None
        self._parked: list[Actor] = []
        self._actors: list[Actor] = []
        self._failure: BaseException | None = None
        self._stopped = False

    @property
    def now(self) -> datetime:
        return self.clock.now()

    @property
    def current(self) -> Actor:
        """The actor holding the baton; only an actor may sleep."""
        if self._current is None:
            raise RuntimeError("only an actor can wait on virtual time")
        return self._current

    @property
    def parked(self) -> int:
        return len(self._parked)

    def _push(self, at: datetime, event: Event) -> None:
        heapq.heappush(self._queue, (max(at, self.now), next(self._seq), event))

    def call_at(self, at: datetime, callback: Callable[[], object]) -> None:
        """Runs `callback` on the scheduler's thread at `at` (now, if `at` has passed)."""
        self._push(at, callback)

    def spawn(self, name: str, body: Callable[[Actor], None], at: datetime) -> Actor:
        """Starts an actor that first runs at `at`."""
        actor = Actor(name)
        thread = threading.Thread(
            target=self._run_actor, args=(actor, body), name=name, daemon=True
        )
        actor._thread = thread
        self._actors.append(actor)
        thread.start()
        self._push(at, actor)
        return actor

    def _run_actor(self, actor: Actor, body: Callable[[Actor], None]) -> None:
        actor._go.acquire()
        try:
            if not actor.stopping:
                body(actor)
        except SimStopped:
            pass
        except BaseException as e:  # handed to the scheduler's thread, which raises it
            self._failure = e
        finally:
            actor.finished = True
            self._back.release()

    def _yield(self, actor: Actor) -> None:
        self._back.release()
        actor._go.acquire()
        if actor.stopping:
            raise SimStopped(f"{actor.name} stopped")

    def sleep(self, delta: timedelta) -> None:
        """The current actor waits `delta` of virtual time while others run.

        Only from the actor's own thread: a helper thread of the actor's (a send pool's) would
        hand the baton on while the actor's thread runs on, two threads racing on one baton.
        """
        actor = self.current
        if threading.current_thread() is not actor._thread:
            raise RuntimeError(f"only {actor.name}'s own thread can wait on its virtual time")
        if actor.stopping:
            raise SimStopped(f"{actor.name} stopped")
        self._push(self.now + delta, actor)
        self._yield(actor)

    def park(self) -> None:
        """The current actor waits until `wake` picks it."""
        actor = self.current
        if actor.stopping:
            raise SimStopped(f"{actor.name} stopped")
        self._parked.append(actor)
        self._yield(actor)

    def wake(self, count: int = 1) -> int:
        """Resumes up to `count` parked actors now, longest-parked first; returns how many."""
        woken = self._parked[:count]
        del self._parked[:count]
        for actor in woken:
            self._push(self.now, actor)
        return len(woken)

    def stop(self) -> None:
        """Ends `run` before its next event."""
        self._stopped = True

    def run(self, until: datetime) -> bool:
        """Runs events up to `until`; True if `stop` ended it, False if time ran out."""
        while self._queue and not self._stopped:
            at, _, event = self._queue[0]
            if at > until:
                break
            heapq.heappop(self._queue)
            self.clock.set(at)
            if isinstance(event, Actor):
                self._current = event
                event._go.release()
                self._back.acquire()
                self._current = None
            else:
                event()
            if self._failure is not None:
                raise self._failure
        return self._stopped

    def close(self) -> None:
        """Stops every actor that has not finished (each unwinds with SimStopped) and joins it."""
        for actor in self._actors:
            if actor.finished:
                continue
            actor.stopping = True
            self._current = actor
            actor._go.release()
            self._back.acquire()
            self._current = None
        for actor in self._actors:
            if actor._thread is not None:
                actor._thread.join()
        self._queue.clear()
        self._parked.clear()
