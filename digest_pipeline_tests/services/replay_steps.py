"""The periods the replay tests start from, and how they call a replay."""

from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.retry import RetryPolicy
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.services.replay import (
    DEFAULT_REPLAY_CAP,
    ReplayReport,
    replay_keys,
)
from digest_pipeline_tests.builders import (
    deliver_all,
    frozen_ledger,
    key_of,
    make_deliverer,
    state_of,
)
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.fakes import FakeLedger, FakeMailer, FixedClock
from digest_pipeline_tests.outcomes import PERMANENT, TRANSIENT

W43 = Period(2026, 43)
#: one attempt per item, so a transient failure dead-letters at once
POLICY = DeliveryPolicy(retry=RetryPolicy(max_attempts=1))

#: customer number -> the state `period_to_replay` leaves it in
STATES = {
    1: DeliveryState.FAILED,
    2: DeliveryState.DEAD_LETTERED,
    3: DeliveryState.SENT,
    4: DeliveryState.UNKNOWN,
    5: DeliveryState.DEAD_LETTERED,
}


def period_to_replay(clock: FixedClock, mailer: FakeMailer) -> FakeLedger:
    """W42 in the states of STATES, and W43 with customer 1 failed."""
    ledger = frozen_ledger(5)
    frozen_ledger(1, period=W43, ledger=ledger)
    mailer.script(key_of(1), PERMANENT)
    mailer.script(key_of(2), TRANSIENT)
    mailer.script(key_of(4), SendOutcome.failed(FailureClass.UNKNOWN, "timeout_after_send"))
    mailer.script(key_of(5), TRANSIENT)
    mailer.script(key_of(1, W43), PERMANENT)
    deliver_all(make_deliverer(ledger, mailer, clock, policy=POLICY))
    assert {n: state_of(ledger, key_of(n)) for n in STATES} == STATES
    return ledger


def replay(
    ledger: FakeLedger,
    mailer: FakeMailer,
    clock: FixedClock,
    keys: list[OperationKey],
    *,
    dry_run: bool = False,
    operator: str = "ana",
    reason: str = "provider outage OPS-7",
    cap: int = DEFAULT_REPLAY_CAP,
    accept: bool = False,
) -> ReplayReport:
    return replay_keys(
        ledger,
        mailer,
        clock,
        W42,
        keys,
        operator=operator,
        reason=reason,
        dry_run=dry_run,
        cap=cap,
        accept_possible_duplicate=accept,
    )


def everything(ledger: FakeLedger) -> tuple[object, ...]:
    """Every record a refused or dry-run replay must leave as it was."""
    return (
        ledger.items(W42),
        ledger.items(W43),
        ledger.audit_log(),
        ledger.dead_letters(W42),
        ledger.dead_letters(W43),
    )
