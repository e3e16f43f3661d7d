"""Small, explicit builders for the service tier: customers, a frozen and enqueued period, a worker.

Every value they make is recognisable in a failure message (`customer-0007`, its address, its
row titles), and every default is visible here rather than hidden in a fixture. The numbered
customers and `seed_period` are the rigs' (`digest_pipeline.rigs.seeding`, which the chaos harness
seeds with too), re-exported here.
"""

from datetime import datetime

from digest_pipeline.domain.errors import DigestError
from digest_pipeline.domain.failures import SendOutcome
from digest_pipeline.domain.model import (
    AttemptTicket,
    Claim,
    CleanupMode,
    CleanupReceipt,
    Customer,
    DigestRow,
    InvariantResult,
    Transition,
)
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.retry import RandomSource
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.ports import (
    Cleaner,
    Clock,
    Composer,
    ContentStore,
    Ledger,
    Mailer,
    SnapshotStore,
    WorkQueue,
)
from digest_pipeline.rigs.seeding import ROWS_PER_CUSTOMER as ROWS_PER_CUSTOMER
from digest_pipeline.rigs.seeding import SHOP_LINK_SETTINGS as SHOP_LINK_SETTINGS
from digest_pipeline.rigs.seeding import SHOP_POSTAL_ADDRESS as SHOP_POSTAL_ADDRESS
from digest_pipeline.rigs.seeding import SHOP_UNSUBSCRIBE_URL as SHOP_UNSUBSCRIBE_URL
from digest_pipeline.rigs.seeding import T0, W42
from digest_pipeline.rigs.seeding import customer_id as customer_id
from digest_pipeline.rigs.seeding import digest_rows_for as digest_rows_for
from digest_pipeline.rigs.seeding import email_of as email_of
from digest_pipeline.rigs.seeding import key_of as key_of
from digest_pipeline.rigs.seeding import row_title as row_title
from digest_pipeline.rigs.seeding import seed_period as seed_period
from digest_pipeline.runtime.executor import executor_for
from digest_pipeline.services.deliver import Deliverer, deliver_due
from digest_pipeline.services.wave import DeliveryReport
from digest_pipeline_tests.fakes import FakeComposer, FakeLedger


def make_customer(
    n: int, *, active: bool = True, opted_in: bool = True, email: str | None = None
) -> Customer:
    return Customer(customer_id(n), email if email is not None else email_of(n), active, opted_in)


def frozen_ledger(
    count: int,
    *,
    period: Period = W42,
    now: datetime = T0,
    rows_per_customer: int = ROWS_PER_CUSTOMER,
    enqueue: bool = True,
    ledger: FakeLedger | None = None,
) -> FakeLedger:
    """A fake ledger seeded by `seed_period`."""
    ledger = ledger if ledger is not None else FakeLedger()
    seed_period(
        ledger,
        count,
        period=period,
        now=now,
        rows_per_customer=rows_per_customer,
        enqueue=enqueue,
    )
    return ledger


def make_deliverer(
    ledger: Ledger,
    mailer: Mailer,
    clock: Clock,
    *,
    policy: DeliveryPolicy | None = None,
    rand: RandomSource = lambda: 0.5,
    owner: str = "w1",
    composer: Composer | None = None,
) -> Deliverer:
    return Deliverer(
        ledger=ledger,
        mailer=mailer,
        composer=composer if composer is not None else FakeComposer(),
        clock=clock,
        policy=policy if policy is not None else DeliveryPolicy(),
        rand=rand,
        owner=owner,
        executor=executor_for(ledger),
    )


def deliver_all(
    deliverer: Deliverer,
    *,
    batch_size: int = 50,
    concurrency: int = 1,
    period: Period | None = None,
) -> DeliveryReport:
    """One `deliver_due` run over everything due now."""
    return deliver_due(deliverer, batch_size=batch_size, concurrency=concurrency, period=period)


def failed_invariants(ledger: Ledger, period: Period, now: datetime) -> list[InvariantResult]:
    """The invariants that do not hold; `[]` is the closing assertion of an end-to-end test."""
    return [r for r in ledger.check_invariants(period, now) if not r.passed]


def state_of(ledger: Ledger, key: OperationKey) -> DeliveryState:
    item = ledger.get(key)
    assert item is not None, f"no work item for {key}"
    return item.state


# One-item forms of the ledger's batch operations: the port has only the batch forms (a worker
# moves a wave at a time); a test that moves one item says so through these.
#: the mailer identity a test's attempts are recorded under unless it names another
TEST_MAILER = "FakeMailer"


def start_one(
    ledger: WorkQueue, claim: Claim, now: datetime, mailer: str = TEST_MAILER
) -> AttemptTicket:
    """Starts one attempt; raises the error (LostRace, UnknownWorkItem) the batch returned."""
    [started] = ledger.start_attempts([claim], now, mailer=mailer)
    if isinstance(started, DigestError):
        raise started
    return started


def complete_one(
    ledger: WorkQueue, ticket: AttemptTicket, outcome: SendOutcome, transition: Transition
) -> None:
    """Closes one attempt and applies its transition; raises LostRace (the attempt is closed)."""
    [error] = ledger.complete_many([(ticket, outcome, transition)])
    if error is not None:
        raise error


def clean_one(
    ledger: Cleaner, key: OperationKey, token: int, mode: CleanupMode, now: datetime
) -> CleanupReceipt:
    """Cleans one key; raises the error (LostRace, UnknownWorkItem) the batch returned."""
    [receipt] = ledger.clean_many([(key, token)], mode, now)
    if isinstance(receipt, DigestError):
        raise receipt
    return receipt


def recipient_of(ledger: SnapshotStore, key: OperationKey) -> str | None:
    """The address frozen for one key, or None."""
    return ledger.recipients([key]).get(key)


def rows_of(ledger: ContentStore, key: OperationKey) -> list[DigestRow]:
    """One key's live generated rows, by position."""
    return ledger.digest_rows_of([key])[key]
