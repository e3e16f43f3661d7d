"""The four crash points of issue 2, each on SQLite and on PostgreSQL, through the real services.

Each test asserts the invariants that matter, not calls: at most one provider delivery per
operation key (counted by the provider), at most one cleanup, a visible state for every item and
no timeout recorded as "not sent".
"""

import threading
from datetime import timedelta

import pytest
from sqlalchemy import func, select

from digest_pipeline.adapters.sql_ledger import SqlLedger
from digest_pipeline.adapters.sql_schema import cleanups, digest_rows, digest_rows_archive
from digest_pipeline.domain.model import CleanupMode
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.states import DeliveryState as S
from digest_pipeline.services.cleanup import clean_period
from digest_pipeline.services.deliver import Deliverer, deliver_due
from digest_pipeline.services.resolve import resolve_unknown
from digest_pipeline.services.sweep import sweep
from digest_pipeline_tests.builders import make_deliverer, seed_period
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.fakes import FakeMailer, FixedClock, WorkerCrash

POLICY = DeliveryPolicy()
N = 6


def seeded(ledger: SqlLedger, clock: FixedClock, n: int = N) -> list[OperationKey]:
    return seed_period(ledger, n, now=clock.now())


def worker(ledger, mailer, clock, owner="w1") -> Deliverer:
    return make_deliverer(ledger, mailer, clock, policy=POLICY, owner=owner)


def settle(ledger, mailer, clock) -> None:
    """What the sensor does after a crash: wait out the lease, then sweep (twice: idempotent)."""
    clock.advance(POLICY.lease + timedelta(seconds=1))
    for _ in range(2):
        sweep(worker(ledger, mailer, clock, "sweeper"), batch_size=50, concurrency=1)


def assert_exactly_once(ledger, mailer, keys, clock) -> None:
    assert all(mailer.deliveries_for(k) == 1 for k in keys), mailer.deliveries
    assert mailer.duplicate_deliveries == 0
    assert {i.state for i in ledger.items(W42)} == {S.CLEANED}
    failing = [r for r in ledger.check_invariants(W42, clock.now()) if not r.passed]
    assert failing == []


@pytest.mark.parametrize(
    "mailer_kind",
    [
        "lookup",  # reconciliation asks the provider: found → sent
        "idempotent_no_lookup",  # resent with the same key inside the provider's window
    ],
)
def test_crash_after_the_provider_accepted_does_not_send_twice(sql_ledger, clock, mailer_kind):
    keys = seeded(sql_ledger, clock)
    mailer = FakeMailer(can_lookup=mailer_kind == "lookup", clock=clock)
    mailer.script_crash_after_accept(keys[2])
    with pytest.raises(WorkerCrash):
        deliver_due(worker(sql_ledger, mailer, clock), batch_size=N, concurrency=1)
    assert sql_ledger.get(keys[2]).state is S.CLAIMED  # the result was never recorded
    settle(sql_ledger, mailer, clock)
    assert_exactly_once(sql_ledger, mailer, keys, clock)


def test_two_workers_on_one_period_send_each_key_once(sql_ledger, clock):
    keys = seeded(sql_ledger, clock, 40)
    mailer = FakeMailer(idempotent=False, clock=clock)  # every send counts: no masking
    reports = []

    def run(owner: str) -> None:
        reports.append(
            deliver_due(worker(sql_ledger, mailer, clock, owner), batch_size=5, concurrency=2)
        )

    threads = [threading.Thread(target=run, args=(f"w{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.claimed for r in reports) == 40
    clean_period(sql_ledger, clock, W42, CleanupMode.ARCHIVE)
    assert_exactly_once(sql_ledger, mailer, keys, clock)


def test_a_stalled_worker_whose_lease_expired_cannot_send(sql_ledger, clock):
    keys = seeded(sql_ledger, clock, 2)
    mailer = FakeMailer(idempotent=False, clock=clock)
    slow = worker(sql_ledger, mailer, clock, "slow")
    stale_claims = sql_ledger.claim_due(clock.now(), "slow", POLICY.lease, 10)
    settle(sql_ledger, mailer, clock)  # lease expires, the sweep redelivers to someone else
    assert [slow.deliver_one(c) for c in stale_claims] == ["lost_race", "lost_race"]
    assert_exactly_once(sql_ledger, mailer, keys, clock)


class StallingMailer(FakeMailer):
    """A provider whose accept takes longer than the lease: the sweeper runs mid-send."""

    def __init__(self, ledger: SqlLedger, clock: FixedClock) -> None:
        super().__init__(idempotent=False, can_lookup=False, clock=clock)
        self._ledger, self._stall_clock = ledger, clock

    def send(self, message, *, idempotency_key):
        self._stall_clock.advance(POLICY.lease + timedelta(seconds=1))
        assert self._ledger.recover_expired_leases(self._stall_clock.now()).unknown == (
            message.key,
        )
        return super().send(message, idempotency_key=idempotency_key)


def test_a_send_that_outlived_its_lease_is_reconciled_from_its_own_attempt(sql_ledger, clock):
    keys = seeded(sql_ledger, clock, 1)
    mailer = StallingMailer(sql_ledger, clock)
    [claim] = sql_ledger.claim_due(clock.now(), "slow", POLICY.lease, 1)
    # the provider accepted, but the item had already moved to unknown: the result loses
    assert worker(sql_ledger, mailer, clock, "slow").deliver_one(claim) == "lost_race"
    assert [a.outcome for a in sql_ledger.attempts(keys[0])] == ["sent"]
    settle(sql_ledger, mailer, clock)
    assert sql_ledger.audit_log(W42)[0].reason == "evidence:ledger_attempt"
    assert_exactly_once(sql_ledger, mailer, keys, clock)


def test_cleanup_rerun_after_a_lost_acknowledgement_cleans_nothing_twice(sql_ledger, clock):
    keys = seeded(sql_ledger, clock)
    mailer = FakeMailer(clock=clock)
    deliver_due(worker(sql_ledger, mailer, clock), batch_size=N, concurrency=2)
    first = clean_period(sql_ledger, clock, W42, CleanupMode.ARCHIVE)
    # the commit happened but the caller never heard: the step is retried
    again = clean_period(sql_ledger, clock, W42, CleanupMode.ARCHIVE)
    assert (first.cleaned, first.rows) == (N, 2 * N)
    assert (again.cleaned, again.already_cleaned, again.rows) == (0, N, 0)
    with sql_ledger.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(cleanups)).scalar_one() == N
        assert conn.execute(select(func.count()).select_from(digest_rows)).scalar_one() == 0
        archived = select(func.count()).select_from(digest_rows_archive)
        assert conn.execute(archived).scalar_one() == 2 * N
    assert_exactly_once(sql_ledger, mailer, keys, clock)


def test_timeout_after_acceptance_is_unknown_then_reconciled_never_not_sent(sql_ledger, clock):
    keys = seeded(sql_ledger, clock)
    mailer = FakeMailer(clock=clock)
    mailer.script_timeout_after_accept(keys[0])
    deliver_due(worker(sql_ledger, mailer, clock), batch_size=N, concurrency=2)
    item = sql_ledger.get(keys[0])
    assert (item.state, item.last_failure_class.value) == (S.UNKNOWN, "unknown")
    assert sql_ledger.check_invariants(W42, clock.now())[1].passed  # no_silent_timeout
    settle(sql_ledger, mailer, clock)
    assert_exactly_once(sql_ledger, mailer, keys, clock)


def test_timeout_with_no_way_to_reconcile_stays_unknown_and_keeps_its_rows(sql_ledger, clock):
    keys = seeded(sql_ledger, clock, 2)
    mailer = FakeMailer(idempotent=False, can_lookup=False, clock=clock)
    mailer.script_timeout_after_accept(keys[0])
    deliver_due(worker(sql_ledger, mailer, clock), batch_size=2, concurrency=1)
    settle(sql_ledger, mailer, clock)
    assert sql_ledger.get(keys[0]).state is S.UNKNOWN
    assert len(sql_ledger.digest_rows(keys[0])) == 2
    assert sql_ledger.get(keys[1]).state is S.CLEANED
    assert all(r.passed for r in sql_ledger.check_invariants(W42, clock.now()))
    # retention runs out: dead-lettered for the operator, the rows still kept
    clock.advance(POLICY.unknown_retention)
    settle(sql_ledger, mailer, clock)
    assert sql_ledger.get(keys[0]).state is S.DEAD_LETTERED
    assert sql_ledger.dead_letters(W42)[0].reason == "unknown_unresolved"
    assert len(sql_ledger.digest_rows(keys[0])) == 2
    assert mailer.deliveries_for(keys[0]) == 1
    assert all(r.passed for r in sql_ledger.check_invariants(W42, clock.now()))


def test_a_retry_whose_earlier_attempt_was_confirmed_late_is_not_sent_again(sql_ledger, clock):
    keys = seeded(sql_ledger, clock, 1)
    mailer = StallingMailer(sql_ledger, clock)
    [claim] = sql_ledger.claim_due(clock.now(), "slow", POLICY.lease, 1)
    assert worker(sql_ledger, mailer, clock, "slow").deliver_one(claim) == "lost_race"
    # an operator resolves "not sent" without reading the attempt history
    resolve_unknown(sql_ledger, clock, keys[0], sent=False, reason="looked lost", operator="op")
    sweep(worker(sql_ledger, mailer, clock, "sweeper"), batch_size=5, concurrency=1)
    # the ledger's own confirmed attempt settles it before any second send
    assert mailer.deliveries_for(keys[0]) == 1
    assert sql_ledger.get(keys[0]).state is S.CLEANED
    assert all(r.passed for r in sql_ledger.check_invariants(W42, clock.now()))
