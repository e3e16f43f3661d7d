"""The steps the ledger contract tests take: freeze a week, claim, send, time out, read back."""

from datetime import timedelta

from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import (
    Claim,
    SnapshotEntry,
    Transition,
)
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.ports import Ledger
from digest_pipeline_tests.builders import complete_one, start_one
from digest_pipeline_tests.conftest import T0, W42

LEASE = timedelta(minutes=2)
W43 = Period(2026, 43)


def key(cid: str, period: Period = W42) -> OperationKey:
    return OperationKey(period, cid)


def frozen(ledger, n: int = 3, period: Period = W42) -> list[OperationKey]:
    entries = [SnapshotEntry(f"customer-{i}", f"c{i}@example.test") for i in range(n)]
    ledger.freeze_snapshot(period, "run-1", T0, entries)
    ledger.enqueue(period, T0)
    return [key(e.customer_id, period) for e in entries]


def claim_one(ledger: Ledger, k: OperationKey, now=T0, owner="w1") -> Claim:
    claims = [c for c in ledger.claim_due(now, owner, LEASE, 100) if c.key == k]
    assert len(claims) == 1
    return claims[0]


def send(
    ledger, claim: Claim, outcome: SendOutcome, target: DeliveryState, now=T0, **fields
) -> None:
    ticket = start_one(ledger, claim, now)
    complete_one(
        ledger,
        ticket,
        outcome,
        Transition(claim.key, DeliveryState.CLAIMED, claim.token, target, now, **fields),
    )


def time_out(ledger: Ledger, claim: Claim) -> None:
    """An attempt that timed out after the request left: the item becomes `unknown`."""
    send(
        ledger,
        claim,
        SendOutcome.failed(FailureClass.UNKNOWN, "timeout"),
        DeliveryState.UNKNOWN,
        failure_class=FailureClass.UNKNOWN,
    )


def snapshot_of(ledger, period: Period = W42):
    return (
        ledger.items(period),
        ledger.dead_letters(period),
        ledger.audit_log(),
        [ledger.attempts(i.key) for i in ledger.items(period)],
    )
