"""The invariant detectors catch what the guards are there to prevent, on every ledger.

The ledger's own guards make these histories impossible through its port, so each test plants
the forbidden row directly (a test-only hook on the fake, plain SQL on the SQL ledgers).
"""

from datetime import datetime, timedelta

from sqlalchemy import insert

from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.adapters.sql.schema import cleanups
from digest_pipeline.domain.failures import SendOutcome
from digest_pipeline.domain.model import SnapshotEntry, Transition
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.ports import Ledger
from digest_pipeline_tests.builders import complete_one, start_one
from digest_pipeline_tests.conftest import T0, W42
from digest_pipeline_tests.fakes import FakeLedger

LEASE = timedelta(minutes=2)


def plant_cleanup(ledger: Ledger, key: OperationKey, at: datetime) -> None:
    """A cleanup row for `key` claimed at `at`, bypassing the cleanup gate."""
    if isinstance(ledger, FakeLedger):
        ledger.force_cleanup_record(key, at)
        return
    assert isinstance(ledger, SqlLedger)
    with ledger.engine.begin() as conn:
        conn.execute(
            insert(cleanups).values(
                operation_key=str(key),
                period=str(key.period),
                mode="delete",
                rows=0,
                claimed_at=at,
                completed_at=at,
            )
        )


def one_key(ledger: Ledger) -> OperationKey:
    ledger.freeze_snapshot(W42, "run-1", T0, [SnapshotEntry("customer-1", "c1@example.test")])
    ledger.enqueue(W42, T0)
    [item] = ledger.items(W42)
    return item.key


def send_at(ledger: Ledger, key: OperationKey, at: datetime) -> None:
    [claim] = ledger.claim_due(at, "w1", LEASE, 1)
    ticket = start_one(ledger, claim, at)
    complete_one(
        ledger,
        ticket,
        SendOutcome.sent("pm-1"),
        Transition(key, DeliveryState.CLAIMED, claim.token, DeliveryState.SENT, at),
    )


def cleanup_result(ledger: Ledger, now: datetime) -> tuple[bool, tuple[str, ...]]:
    [r] = ledger.check_invariants(W42, now, names={"at_most_one_cleanup_per_key"})
    return r.passed, r.sample


def test_a_cleanup_before_a_later_send_is_detected(ledger):
    key = one_key(ledger)
    plant_cleanup(ledger, key, T0)
    later = T0 + timedelta(minutes=5)
    send_at(ledger, key, later)

    assert cleanup_result(ledger, later) == (False, (str(key),))


def test_a_cleanup_of_an_item_never_sent_is_detected(ledger):
    key = one_key(ledger)
    plant_cleanup(ledger, key, T0)

    assert cleanup_result(ledger, T0) == (False, (str(key),))


def test_a_cleanup_after_the_send_passes(ledger):
    key = one_key(ledger)
    send_at(ledger, key, T0)
    plant_cleanup(ledger, key, T0 + timedelta(seconds=1))

    assert cleanup_result(ledger, T0 + timedelta(seconds=1)) == (True, ())
