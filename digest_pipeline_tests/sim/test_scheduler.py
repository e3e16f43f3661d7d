"""The scheduler runs one actor at a time in (virtual time, sequence) order and stops them all."""

from datetime import UTC, datetime, timedelta

import pytest

from digest_pipeline.rigs.sim.clock import VirtualClock
from digest_pipeline.rigs.sim.scheduler import Actor, ActorClock, Scheduler, SimStopped

T = datetime(2026, 10, 19, 6, 0, tzinfo=UTC)
SECOND = timedelta(seconds=1)


def test_actors_and_callbacks_interleave_in_virtual_time_order():
    sched, seen = Scheduler(VirtualClock(T)), []

    def body(name: str, step: timedelta):
        def run(actor: Actor) -> None:
            for _ in range(3):
                seen.append((name, (sched.now - T).total_seconds()))
                sched.sleep(step)

        return run

    sched.spawn("a", body("a", 2 * SECOND), T)
    sched.spawn("b", body("b", 3 * SECOND), T + SECOND)
    sched.call_at(T + 4 * SECOND, lambda: seen.append(("tick", 4.0)))
    assert sched.run(until=T + timedelta(minutes=1)) is False  # ran out of events, not stopped
    sched.close()
    assert seen == [
        ("a", 0.0),
        ("b", 1.0),
        ("a", 2.0),
        ("tick", 4.0),  # queued first, so first among the events at 4 s
        ("b", 4.0),
        ("a", 4.0),
        ("b", 7.0),
    ]


def test_a_parked_actor_runs_again_only_when_woken():
    sched, seen = Scheduler(VirtualClock(T)), []

    def idle(actor: Actor) -> None:
        sched.park()
        seen.append((sched.now - T).total_seconds())

    sched.spawn("idle", idle, T)
    sched.call_at(T + 5 * SECOND, lambda: sched.wake(1))
    sched.run(until=T + timedelta(minutes=1))
    sched.close()
    assert seen == [5.0]


def test_close_stops_waiting_actors_and_their_clocks():
    sched = Scheduler(VirtualClock(T))
    clocks: list[ActorClock] = []

    def forever(actor: Actor) -> None:
        clocks.append(ActorClock(actor, sched.clock))
        while True:
            sched.sleep(SECOND)

    sched.spawn("forever", forever, T)
    sched.call_at(T + 10 * SECOND, sched.stop)
    assert sched.run(until=T + timedelta(hours=1)) is True
    sched.close()
    with pytest.raises(SimStopped):
        clocks[0].now()


def test_an_actors_error_is_raised_on_the_schedulers_thread():
    sched = Scheduler(VirtualClock(T))

    def broken(actor: Actor) -> None:
        raise ValueError("boom")

    sched.spawn("broken", broken, T)
    with pytest.raises(ValueError, match="boom"):
        sched.run(until=T + SECOND)
    sched.close()


def test_virtual_time_never_goes_back():
    clock = VirtualClock(T)
    with pytest.raises(ValueError, match="cannot go back"):
        clock.set(T - SECOND)
