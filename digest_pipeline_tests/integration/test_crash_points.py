"""The four crash points, each on SQLite and PostgreSQL, through the real services and mailers.

Each test asserts the invariants that matter, not calls: at most one provider delivery per
operation key (counted by the provider's own store: the fake's record, the Maildir, the HTTP
server), at most one cleanup, a visible state for every item and no timeout recorded as
"not sent".
"""

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta

import pytest
from sqlalchemy import func, select

from digest_pipeline.adapters.mail.http import HttpProviderMailer
from digest_pipeline.adapters.mail.outbox import OutboxMailer, file_name
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.adapters.sql.schema import cleanups, digest_rows, digest_rows_archive
from digest_pipeline.domain.model import CleanupMode
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.rigs.servers.provider_server import ProviderServer
from digest_pipeline.services.cleanup import clean_period
from digest_pipeline.services.deliver import Deliverer, deliver_due
from digest_pipeline.services.pipeline import sweep
from digest_pipeline.services.resolve import resolve_unknown
from digest_pipeline.settings import ProviderSettings
from digest_pipeline_tests.builders import make_deliverer, rows_of, seed_period
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.fakes import FakeMailer, FaultInjectingMailer, FixedClock, WorkerCrash

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


@dataclass
class Provider:
    """A mailer with faults on demand, and the peer's own count of what it delivered."""

    mailer: FaultInjectingMailer
    delivered: Callable[[OperationKey], int]


@pytest.fixture(params=["fake", "fake-resend", "outbox", "http"])
def provider(request: pytest.FixtureRequest, clock: FixedClock, tmp_path) -> Iterator[Provider]:
    """fake: looks keys up; fake-resend: idempotent without lookup (reconciled by resending);
    outbox: a real Maildir; http: the real HTTP mailer against the loopback provider server."""
    kind = request.param
    if kind.startswith("fake"):
        fake = FakeMailer(can_lookup=kind == "fake", clock=clock)
        yield Provider(FaultInjectingMailer(fake), fake.deliveries_for)
    elif kind == "outbox":
        outbox = OutboxMailer(tmp_path / "outbox")

        def files(key: OperationKey) -> int:
            return sum(p.name == file_name(key) for p in outbox.stored())

        yield Provider(FaultInjectingMailer(outbox), files)
    else:
        with ProviderServer() as server:
            settings = ProviderSettings(server.url, server.api_key, 2.0, timedelta(hours=24))
            with HttpProviderMailer(settings) as http:
                yield Provider(FaultInjectingMailer(http), server.delivered_count)


def assert_exactly_once(ledger, delivered, keys, clock) -> None:
    assert [delivered(k) for k in keys] == [1] * len(keys)
    assert {i.state for i in ledger.items(W42)} == {DeliveryState.CLEANED}
    failing = [r for r in ledger.check_invariants(W42, clock.now()) if not r.passed]
    assert failing == []


def test_crash_after_the_provider_accepted_does_not_send_twice(sql_ledger, clock, provider):
    keys = seeded(sql_ledger, clock)
    provider.mailer.crash_after_accept(keys[2])
    with pytest.raises(WorkerCrash):
        deliver_due(worker(sql_ledger, provider.mailer, clock), batch_size=N, concurrency=1)
    assert sql_ledger.get(keys[2]).state is DeliveryState.CLAIMED  # the result was never recorded
    settle(sql_ledger, provider.mailer, clock)
    assert_exactly_once(sql_ledger, provider.delivered, keys, clock)


def test_two_workers_on_one_period_send_each_key_once(sql_ledger, clock, provider):
    keys = seeded(sql_ledger, clock, 40)
    reports = []

    def run(owner: str) -> None:
        deliverer = worker(sql_ledger, provider.mailer, clock, owner)
        reports.append(deliver_due(deliverer, batch_size=5, concurrency=2))

    threads = [threading.Thread(target=run, args=(f"w{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.claimed for r in reports) == 40
    # one claim and one attempt per item: the provider's deduplication was never needed
    assert {(i.lease_token, i.attempts) for i in sql_ledger.items(W42)} == {(1, 1)}
    clean_period(sql_ledger, clock, W42, CleanupMode.ARCHIVE)
    assert_exactly_once(sql_ledger, provider.delivered, keys, clock)


def test_a_stalled_worker_whose_lease_expired_cannot_send(sql_ledger, clock):
    keys = seeded(sql_ledger, clock, 2)
    mailer = FakeMailer(idempotent=False, clock=clock)
    slow = worker(sql_ledger, mailer, clock, "slow")
    stale_claims = sql_ledger.claim_due(clock.now(), "slow", POLICY.lease, 10)
    settle(sql_ledger, mailer, clock)  # lease expires, the sweep redelivers to someone else
    assert [slow.deliver_one(c) for c in stale_claims] == ["lost_race", "lost_race"]
    assert_exactly_once(sql_ledger, mailer.deliveries_for, keys, clock)


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
    assert_exactly_once(sql_ledger, mailer.deliveries_for, keys, clock)


def test_cleanup_rerun_after_a_lost_acknowledgement_cleans_nothing_twice(
    sql_ledger, clock, provider
):
    keys = seeded(sql_ledger, clock)
    deliver_due(worker(sql_ledger, provider.mailer, clock), batch_size=N, concurrency=2)
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
    assert_exactly_once(sql_ledger, provider.delivered, keys, clock)


def test_timeout_after_acceptance_is_unknown_then_reconciled_never_not_sent(
    sql_ledger, clock, provider
):
    keys = seeded(sql_ledger, clock)
    provider.mailer.timeout_after_accept(keys[0])
    deliver_due(worker(sql_ledger, provider.mailer, clock), batch_size=N, concurrency=2)
    item = sql_ledger.get(keys[0])
    assert (item.state, item.last_failure_class.value) == (DeliveryState.UNKNOWN, "unknown")
    assert sql_ledger.check_invariants(W42, clock.now())[1].passed  # no_silent_timeout
    settle(sql_ledger, provider.mailer, clock)
    assert_exactly_once(sql_ledger, provider.delivered, keys, clock)


def test_timeout_with_no_way_to_reconcile_stays_unknown_and_keeps_its_rows(sql_ledger, clock):
    keys = seeded(sql_ledger, clock, 2)
    mailer = FakeMailer(idempotent=False, can_lookup=False, clock=clock)
    mailer.script_timeout_after_accept(keys[0])
    deliver_due(worker(sql_ledger, mailer, clock), batch_size=2, concurrency=1)
    settle(sql_ledger, mailer, clock)
    assert sql_ledger.get(keys[0]).state is DeliveryState.UNKNOWN
    assert len(rows_of(sql_ledger, keys[0])) == 2
    assert sql_ledger.get(keys[1]).state is DeliveryState.CLEANED
    assert all(r.passed for r in sql_ledger.check_invariants(W42, clock.now()))
    # retention runs out: dead-lettered for the operator, the rows still kept
    clock.advance(POLICY.unknown_retention)
    settle(sql_ledger, mailer, clock)
    assert sql_ledger.get(keys[0]).state is DeliveryState.DEAD_LETTERED
    assert sql_ledger.dead_letters(W42)[0].reason == "unknown_unresolved"
    assert len(rows_of(sql_ledger, keys[0])) == 2
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
    assert sql_ledger.get(keys[0]).state is DeliveryState.CLEANED
    assert all(r.passed for r in sql_ledger.check_invariants(W42, clock.now()))
