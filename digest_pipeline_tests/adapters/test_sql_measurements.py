"""The SQL ledger's rig measurements count what its records hold, on SQLite and PostgreSQL."""

from datetime import timedelta

from sqlalchemy import insert

from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.adapters.sql.schema import attempts
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import CleanupMode, Transition
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline_tests.builders import clean_one, complete_one, seed_period, start_one
from digest_pipeline_tests.conftest import T0, W42

LEASE = timedelta(minutes=2)


def test_the_measurements_count_attempts_unknowns_cleanups_and_workers(sql_ledger: SqlLedger):
    ledger = sql_ledger
    sent, stranded, retried = seed_period(ledger, 3)
    claims = {c.key: c for c in ledger.claim_due(T0, "run1:b0", LEASE, 3, W42)}

    def attempt(key, outcome: SendOutcome, target: DeliveryState, at=T0, **fields) -> None:
        claim = claims[key]
        ticket = start_one(ledger, claim, at)
        t = Transition(key, DeliveryState.CLAIMED, claim.token, target, at, **fields)
        complete_one(ledger, ticket, outcome, t)

    attempt(sent, SendOutcome.sent("pm-1"), DeliveryState.SENT)
    start_one(ledger, claims[stranded], T0)  # its worker dies mid-send
    transient = SendOutcome.failed(FailureClass.TRANSIENT, "smtp:451")
    attempt(retried, transient, DeliveryState.RETRY_SCHEDULED, next_attempt_at=T0, detail="451")
    [again] = ledger.claim_due(T0, "run2:b0", LEASE, 1, W42)
    claims[retried] = again
    attempt(retried, SendOutcome.sent("pm-3"), DeliveryState.SENT)
    # a second confirmed send of `sent`, which the ledger's guards never allow: planted
    with ledger.engine.begin() as conn:
        conn.execute(
            insert(attempts).values(
                operation_key=str(sent),
                number=2,
                lease_token=99,
                worker="run9:b0",
                started_at=T0,
                finished_at=T0,
                outcome="sent",
            )
        )

    tally = ledger.attempt_tally(W42)
    assert (tally.keys_sent_twice, tally.keys_attempted_twice, tally.open_attempts) == (1, 2, 1)
    assert ledger.attempts_with_detail(W42, "smtp:451") == 1
    assert ledger.sent_by_worker("run1:") == {"run1:b0": 1}
    assert ledger.sent_by_worker("run") == {"run1:b0": 1, "run2:b0": 1, "run9:b0": 1}

    assert ledger.keys_ever_unknown(W42) == 0
    recovered = ledger.recover_expired_leases(T0 + LEASE + timedelta(seconds=1))
    assert recovered.unknown == (stranded,)
    assert ledger.keys_ever_unknown(W42) == 1

    assert ledger.cleanup_rows_per_key(W42) == {}
    clean_one(ledger, sent, claims[sent].token, CleanupMode.DELETE, T0 + timedelta(minutes=5))
    assert ledger.cleanup_rows_per_key(W42) == {str(sent): 1}
