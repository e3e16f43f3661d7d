"""Bad input on a real ledger: a clear one-line error, and every table exactly as it was.

The dump compares every row of every ledger table before and after each refused request.
"""

import random

import pytest
from sqlalchemy import select

from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.adapters.sql.schema import metadata
from digest_pipeline.domain.errors import (
    DigestError,
    InvalidOperationKey,
    InvalidPeriod,
    ReplayRefused,
    ResolveRefused,
    UnknownWorkItem,
)
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import SnapshotEntry
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.retry import RetryPolicy
from digest_pipeline.runtime.executor import executor_for
from digest_pipeline.services.deliver import Deliverer, deliver_due
from digest_pipeline.services.replay import replay_keys
from digest_pipeline.services.resolve import resolve_unknown
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.fakes import FakeComposer, FakeMailer

N = 120


def dump(ledger: SqlLedger) -> dict[str, list[tuple[object, ...]]]:
    with ledger.engine.connect() as conn:
        return {
            t.name: [tuple(r) for r in conn.execute(select(t).order_by(*t.primary_key.columns))]
            for t in metadata.sorted_tables
        }


@pytest.fixture
def populated(sql_ledger, clock):
    """A delivered period: most sent, some failed (permanent), one unknown."""
    entries = [SnapshotEntry(f"customer-{i:03d}", f"c{i}@example.test") for i in range(N)]
    sql_ledger.freeze_snapshot(W42, "run-1", clock.now(), entries)
    sql_ledger.enqueue(W42, clock.now())
    mailer = FakeMailer(idempotent=False, can_lookup=False, clock=clock)
    for i in range(0, N, 2):
        mailer.script(
            f"digest:2026-W42:customer-{i:03d}",
            SendOutcome.failed(FailureClass.PERMANENT, "smtp:550"),
        )
    mailer.script_timeout_after_accept("digest:2026-W42:customer-001")
    policy = DeliveryPolicy(retry=RetryPolicy(max_attempts=1))
    deliverer = Deliverer(
        sql_ledger,
        mailer,
        FakeComposer(),
        clock,
        policy,
        random.Random(1).random,
        "w1",
        executor_for(sql_ledger),
    )
    deliver_due(deliverer, batch_size=50, concurrency=4)
    return sql_ledger, mailer


def key(i: int, period: str = "2026-W42") -> OperationKey:
    return OperationKey.parse(f"digest:{period}:customer-{i:03d}")


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        pytest.param(
            [key(i) for i in range(0, 2 * 101, 2)], "exceed the replay cap of 100", id="over-cap"
        ),
        pytest.param([key(0), key(2, "2026-W43")], "not of period 2026-W42", id="other-period"),
        pytest.param([key(0), OperationKey(W42, "nobody")], "is unknown", id="unknown-key"),
        pytest.param([key(0), key(3)], "is sent, not dead_lettered or failed", id="sent-key"),
        pytest.param([], "at least one key", id="no-keys"),
    ],
)
def test_a_refused_replay_changes_nothing(populated, clock, keys, message):
    ledger, mailer = populated
    before = dump(ledger)
    with pytest.raises(ReplayRefused, match=message) as e:
        replay_keys(ledger, mailer, clock, W42, keys, operator="alice", reason="fix", dry_run=False)
    assert "\n" not in str(e.value)
    assert dump(ledger) == before


def test_a_dry_run_replay_changes_nothing(populated, clock):
    ledger, mailer = populated
    before = dump(ledger)
    report = replay_keys(
        ledger, mailer, clock, W42, [key(0), key(2)], operator="alice", reason="fix", dry_run=True
    )
    assert report.replayed == 2
    assert dump(ledger) == before


@pytest.mark.parametrize(
    ("target", "reason", "error"),
    [
        pytest.param(key(3), "checked", ResolveRefused, id="sent-item"),
        pytest.param(key(1), "  ", ResolveRefused, id="empty-reason"),
        pytest.param(OperationKey(W42, "nobody"), "checked", UnknownWorkItem, id="unknown-key"),
    ],
)
def test_a_refused_resolution_changes_nothing(populated, clock, target, reason, error):
    ledger, _ = populated
    before = dump(ledger)
    with pytest.raises(error):
        resolve_unknown(ledger, clock, target, sent=True, reason=reason, operator="alice")
    assert dump(ledger) == before


@pytest.mark.parametrize(
    ("parse", "text", "error"),
    [
        (Period.parse, "2026-W54", InvalidPeriod),  # no such ISO week
        (Period.parse, "2026-10-13", InvalidPeriod),  # a Tuesday
        (Period.parse, "", InvalidPeriod),
        (OperationKey.parse, "digest:2026-W42", InvalidOperationKey),
        (OperationKey.parse, "digest:2026-10-12:customer-1", InvalidOperationKey),
        (OperationKey.parse, "digest:2026-W42:a b", InvalidOperationKey),
    ],
)
def test_malformed_periods_and_keys_are_one_line_errors(parse, text, error):
    with pytest.raises(error) as e:
        parse(text)
    assert isinstance(e.value, DigestError)
    assert "\n" not in str(e.value)
