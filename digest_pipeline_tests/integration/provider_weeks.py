"""A shop's week against the HTTP provider, read back: its items, its sweeps, done once.

Shared by the tests that run weeks through `digest run` (in process or on Celery workers) with
a `CeleryRig` launcher and a `ProviderServer`.
"""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from sqlalchemy import Connection, select

from digest_pipeline.adapters.sql.engine import create_ledger_engine
from digest_pipeline.adapters.sql.invariants import evaluate_invariants
from digest_pipeline.adapters.sql.schema import dead_letters, work_items
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.retry import DeadLetterReason
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.rigs.servers.celery_rig import CeleryRig, finished
from digest_pipeline.rigs.servers.provider_server import ProviderServer

#: where a week's items end once nothing is left to do (`failed`: an address refused)
FINISHED = (DeliveryState.CLEANED, DeliveryState.FAILED)
#: where an item waits for an operator, failing closed, when a killed process left its attempt
#: open (so `unknown`) and the resend then failed for good: a digest that can never render, say.
#: Nothing proves the first attempt never left, so it is not `failed`. Which item a kill catches
#: is a matter of timing; `assert_week_done_once` still requires that the provider holds none.
UNRESOLVED = DeadLetterReason.UNKNOWN_UNRESOLVED.value


@contextmanager
def ledger(rig: CeleryRig) -> Iterator[Connection]:
    """A connection to the rig's ledger, on an engine of its own disposed afterwards."""
    engine = create_ledger_engine(rig.settings["DIGEST_DATABASE_URL"])
    try:
        with engine.connect() as conn:
            yield conn
    finally:
        engine.dispose()


def unfinished(rig: CeleryRig, period: Period) -> dict[str, str]:
    """The period's items neither `FINISHED` nor dead-lettered as `UNRESOLVED`, with states."""
    with ledger(rig) as conn:
        waiting = set(
            conn.execute(
                select(dead_letters.c.operation_key).where(
                    dead_letters.c.period == str(period), dead_letters.c.reason == UNRESOLVED
                )
            ).scalars()
        )
    return {
        k: s
        for k, s in states(rig, period).items()
        if s not in FINISHED and not (s == DeliveryState.DEAD_LETTERED and k in waiting)
    }


def states(rig: CeleryRig, period: Period) -> dict[str, str]:
    """The period's items: operation key to state."""
    with ledger(rig) as conn:
        rows = conn.execute(
            select(work_items.c.operation_key, work_items.c.state).where(
                work_items.c.period == str(period)
            )
        ).all()
    return {key: state for key, state in rows}


def sweep_until_finished(rig: CeleryRig, period: Period, passes: int = 10) -> None:
    """`digest sweep` every 2 s, at most `passes` times, until every item is finished.

    What a run left due (retries within seconds: the rigs' retry bounds are short) the sweep
    delivers and cleans, as the sweeper's runs would.
    """
    for _ in range(passes):
        if not unfinished(rig, period):
            return
        time.sleep(2)
        code, output = finished(rig.digest("sweep"))
        assert code == 0, output


def assert_week_done_once(rig: CeleryRig, provider: ProviderServer, period: Period) -> None:
    """Every item finished (or `UNRESOLVED`), every invariant holds, and the provider stored each
    sent key once and no other."""
    found = states(rig, period)
    assert found, f"{period} has no work items"
    open_states = unfinished(rig, period)
    assert open_states == {}, f"{period}: items not finished: {open_states}"
    with ledger(rig) as conn:
        failed = [
            r.name for r in evaluate_invariants(conn, period, datetime.now(UTC)) if not r.passed
        ]
    assert failed == [], f"{period}: invariants violated: {failed}"
    stored = provider.stored
    cleaned = {k for k, s in found.items() if s == DeliveryState.CLEANED}
    assert {k for k in stored if k in found} == cleaned, "sent items are those the provider holds"
    twice = {k: len(v) for k, v in stored.items() if k in found and len(v) != 1}
    assert twice == {}, f"{period}: messages stored more than once: {twice}"
