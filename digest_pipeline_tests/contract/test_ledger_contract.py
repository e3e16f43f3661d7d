"""The ledger contract, run unchanged over the fake, SQLite and PostgreSQL.

If the fake passes and a real ledger fails (or the reverse), the fake has drifted from what the
real ledger enforces and every service test built on it is suspect.
"""

from datetime import UTC, timedelta

import pytest

from digest_pipeline.domain.errors import (
    InvalidTransition,
    LostRace,
    SnapshotMissing,
    UnknownWorkItem,
)
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import (
    AuditEntry,
    AuditNote,
    ClearDedupe,
    RefundBudget,
    Reopen,
    ResendUntil,
    SnapshotEntry,
    Transition,
    WriteDeadLetter,
)
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline_tests.builders import complete_one, recipient_of, start_one
from digest_pipeline_tests.conftest import T0, W42
from digest_pipeline_tests.contract.ledger_steps import (
    LEASE,
    W43,
    claim_one,
    frozen,
    key,
    send,
    snapshot_of,
    time_out,
)


class TestSnapshot:
    def test_freezing_twice_keeps_the_first_selection(self, ledger):
        first = ledger.freeze_snapshot(W42, "run-1", T0, [SnapshotEntry("a", "a@x.test")])
        again = ledger.freeze_snapshot(
            W42, "run-2", T0 + timedelta(hours=1), [SnapshotEntry("b", "b@x.test")]
        )
        assert not first.reused
        assert again.reused
        assert again.info.selection_run_id == "run-1"
        assert ledger.snapshot_entries(W42) == [SnapshotEntry("a", "a@x.test")]

    def test_duplicate_customer_in_a_selection_stores_nothing(self, ledger):
        dup = [SnapshotEntry("a", "a@x.test"), SnapshotEntry("a", "other@x.test")]
        with pytest.raises(ValueError, match="duplicate customer id"):
            ledger.freeze_snapshot(W42, "run-1", T0, dup)
        assert ledger.snapshot(W42) is None
        assert ledger.snapshot_entries(W42) == []

    def test_recipient_is_the_address_frozen_for_that_period(self, ledger):
        frozen(ledger)
        assert recipient_of(ledger, key("customer-1")) == "c1@example.test"
        assert recipient_of(ledger, key("customer-1", W43)) is None

    def test_datetimes_come_back_aware_utc(self, ledger):
        frozen(ledger)
        info = ledger.snapshot(W42)
        item = ledger.get(key("customer-0"))
        assert info.selected_at == T0
        assert info.selected_at.tzinfo is not None
        assert item.created_at.utcoffset() == timedelta(0)
        assert item.created_at.astimezone(UTC) == T0


class TestEnqueue:
    def test_enqueue_without_a_snapshot_is_refused(self, ledger):
        with pytest.raises(SnapshotMissing):
            ledger.enqueue(W42, T0)

    def test_enqueue_creates_one_pending_item_per_entry_once(self, ledger):
        keys = frozen(ledger, 3)
        again = ledger.enqueue(W42, T0 + timedelta(minutes=5))
        assert (again.created, again.existing) == (0, 3)
        items = ledger.items(W42)
        assert [i.key for i in items] == sorted(keys, key=str)
        assert {i.state for i in items} == {DeliveryState.PENDING}
        assert all(i.next_attempt_at == T0 and i.created_at == T0 for i in items)
        assert ledger.snapshot(W42).enqueued_at == T0


class TestClaims:
    def test_claims_take_only_due_items_up_to_the_limit_with_fresh_tokens(self, ledger):
        frozen(ledger, 5)
        first = ledger.claim_due(T0, "w1", LEASE, 3)
        second = ledger.claim_due(T0, "w2", LEASE, 10)
        assert len(first) == 3
        assert len(second) == 2
        assert not {c.key for c in first} & {c.key for c in second}
        assert all(c.token == 1 and c.expires_at == T0 + LEASE for c in first + second)
        assert ledger.claim_due(T0, "w3", LEASE, 10) == []
        assert ledger.state_counts(W42) == {DeliveryState.CLAIMED: 5}

    def test_claims_can_be_limited_to_one_period(self, ledger):
        frozen(ledger, 2, W42)
        frozen(ledger, 2, W43)
        claims = ledger.claim_due(T0, "w1", LEASE, 10, W43)
        assert {c.key.period for c in claims} == {W43}
        assert ledger.claim_due(T0, "w1", LEASE, 0) == []

    def test_a_retry_is_claimed_only_once_due_and_with_the_next_token(self, ledger):
        k = frozen(ledger, 1)[0]
        c = claim_one(ledger, k)
        later = T0 + timedelta(minutes=10)
        send(
            ledger,
            c,
            SendOutcome.failed(FailureClass.TRANSIENT, "smtp:451"),
            DeliveryState.RETRY_SCHEDULED,
            next_attempt_at=later,
            failure_class=FailureClass.TRANSIENT,
        )
        assert ledger.claim_due(later - timedelta(seconds=1), "w1", LEASE, 10) == []
        again = claim_one(ledger, k, now=later, owner="w2")
        assert again.token == c.token + 1
        assert again.item.first_claimed_at == T0


class TestAttempts:
    def test_an_attempt_is_recorded_open_before_the_send(self, ledger):
        k = frozen(ledger, 1)[0]
        c = claim_one(ledger, k)
        ticket = start_one(ledger, c, T0)
        [a] = ledger.attempts(k)
        assert (a.number, a.token, a.finished_at, a.outcome) == (1, c.token, None, None)
        assert ticket.attempt_id == a.attempt_id
        item = ledger.get(k)
        assert (item.attempts, item.budget_used, item.first_attempt_at) == (1, 1, T0)
        assert ledger.attempt_outcome_counts(W42) == {"open": 1}

    def test_a_stale_token_cannot_start_an_attempt(self, ledger):
        k = frozen(ledger, 1)[0]
        c = claim_one(ledger, k)
        ledger.recover_expired_leases(T0 + LEASE)  # no attempt open: back to due
        claim_one(ledger, k, now=T0 + LEASE, owner="w2")
        with pytest.raises(LostRace):
            start_one(ledger, c, T0 + LEASE)
        assert ledger.attempts(k) == []

    def test_an_expired_lease_cannot_start_an_attempt(self, ledger):
        k = frozen(ledger, 1)[0]
        c = claim_one(ledger, k)
        with pytest.raises(LostRace):
            start_one(ledger, c, T0 + LEASE)

    def test_unknown_keys_are_reported_as_such(self, ledger):
        frozen(ledger, 1)
        ghost = key("nobody")
        with pytest.raises(UnknownWorkItem):
            ledger.apply(Transition(ghost, DeliveryState.UNKNOWN, 0, DeliveryState.SENT, T0))
        assert ledger.get(ghost) is None

    def test_completing_a_send_records_outcome_and_state_together(self, ledger):
        k = frozen(ledger, 1)[0]
        c = claim_one(ledger, k)
        send(ledger, c, SendOutcome.sent("pm-1"), DeliveryState.SENT, provider_message_id="pm-1")
        item = ledger.get(k)
        [a] = ledger.attempts(k)
        assert (item.state, item.sent_at, item.provider_message_id) == (
            DeliveryState.SENT,
            T0,
            "pm-1",
        )
        assert (item.lease_owner, item.lease_expires_at) == (None, None)
        assert (a.outcome, a.provider_message_id, a.finished_at) == ("sent", "pm-1", T0)
        assert ledger.attempt_outcome_counts(W42) == {"sent": 1}

    def test_an_illegal_move_raises_and_changes_nothing(self, ledger):
        k = frozen(ledger, 1)[0]
        c = claim_one(ledger, k)
        ticket = start_one(ledger, c, T0)
        before = snapshot_of(ledger)
        bad = Transition(k, DeliveryState.CLAIMED, c.token, DeliveryState.CLEANED, T0)
        with pytest.raises(InvalidTransition):
            complete_one(ledger, ticket, SendOutcome.sent("pm"), bad)
        assert snapshot_of(ledger) == before

    def test_a_lost_race_still_closes_the_attempt_as_evidence(self, ledger):
        k = frozen(ledger, 1)[0]
        c = claim_one(ledger, k)
        ticket = start_one(ledger, c, T0)
        recovery = ledger.recover_expired_leases(T0 + LEASE)
        assert recovery.unknown == (k,)
        late = T0 + LEASE + timedelta(seconds=5)
        with pytest.raises(LostRace):
            complete_one(
                ledger,
                ticket,
                SendOutcome.sent("pm-late"),
                Transition(
                    k,
                    DeliveryState.CLAIMED,
                    c.token,
                    DeliveryState.SENT,
                    late,
                    provider_message_id="pm-late",
                ),
            )
        assert ledger.get(k).state is DeliveryState.UNKNOWN
        [a] = ledger.attempts(k)
        assert (a.outcome, a.provider_message_id) == ("sent", "pm-late")


class TestTransitions:
    def test_dead_lettering_writes_a_row_without_address_or_content(self, ledger):
        k = frozen(ledger, 1)[0]
        c = claim_one(ledger, k)
        send(
            ledger,
            c,
            SendOutcome.failed(FailureClass.TRANSIENT, "smtp:451"),
            DeliveryState.DEAD_LETTERED,
            failure_class=FailureClass.TRANSIENT,
            effects=(WriteDeadLetter("max_attempts"),),
        )
        [row] = ledger.dead_letters(W42)
        assert (row.key, row.reason, row.attempts) == (k, "max_attempts", 1)
        assert row.last_failure_class is FailureClass.TRANSIENT
        assert row.replayed_at is None
        assert "@" not in repr(row)

    def test_replay_reopens_with_a_fresh_budget_and_marks_the_dead_letter(self, ledger):
        k = frozen(ledger, 1)[0]
        c = claim_one(ledger, k)
        send(
            ledger,
            c,
            SendOutcome.failed(FailureClass.PERMANENT, "smtp:550"),
            DeliveryState.FAILED,
            failure_class=FailureClass.PERMANENT,
            effects=(WriteDeadLetter("permanent"),),
        )
        later = T0 + timedelta(days=1)
        ledger.apply(
            Transition(
                k,
                DeliveryState.FAILED,
                c.token,
                DeliveryState.PENDING,
                later,
                next_attempt_at=later,
                effects=(Reopen(),),
                audit=AuditNote("alice", "replay", "address fixed"),
            )
        )
        item = ledger.get(k)
        assert (item.state, item.budget_used, item.window_started_at) == (
            DeliveryState.PENDING,
            0,
            None,
        )
        assert (item.attempts, item.replayed_at) == (1, later)
        assert ledger.dead_letters(W42)[0].replayed_at == later
        [entry] = ledger.audit_log(W42)
        assert (entry.actor, entry.action, entry.from_state, entry.to_state) == (
            "alice",
            "replay",
            DeliveryState.FAILED,
            DeliveryState.PENDING,
        )

    def test_a_throttled_outcome_refunds_the_budget_unit(self, ledger):
        k = frozen(ledger, 1)[0]
        c = claim_one(ledger, k)
        send(
            ledger,
            c,
            SendOutcome.failed(FailureClass.THROTTLED, "http:429"),
            DeliveryState.RETRY_SCHEDULED,
            next_attempt_at=T0 + timedelta(seconds=30),
            failure_class=FailureClass.THROTTLED,
            effects=(RefundBudget(),),
        )
        item = ledger.get(k)
        assert (item.attempts, item.budget_used) == (1, 0)

    def test_a_dedupe_deadline_is_kept_until_evidence_or_replay_clears_it(self, ledger):
        k = frozen(ledger, 1)[0]
        c = claim_one(ledger, k)
        time_out(ledger, c)
        until = T0 + timedelta(hours=24)
        ledger.apply(
            Transition(
                k,
                DeliveryState.UNKNOWN,
                c.token,
                DeliveryState.RETRY_SCHEDULED,
                T0,
                next_attempt_at=T0,
                effects=(ResendUntil(until),),
            )
        )
        again = claim_one(ledger, k)
        assert again.item.dedupe_until == until
        ledger.apply(Transition(k, DeliveryState.CLAIMED, again.token, DeliveryState.UNKNOWN, T0))
        assert ledger.get(k).dedupe_until == until
        ledger.apply(
            Transition(
                k,
                DeliveryState.UNKNOWN,
                again.token,
                DeliveryState.RETRY_SCHEDULED,
                T0,
                next_attempt_at=T0,
                effects=(ClearDedupe(),),
            )
        )
        assert ledger.get(k).dedupe_until is None

    def test_audit_rows_can_be_recorded_without_a_move(self, ledger):
        ledger.record_audit(AuditEntry(T0, "bob", "note", None, None, None, "checked", W42))
        [entry] = ledger.audit_log()
        assert (entry.actor, entry.period, entry.key) == ("bob", W42, None)
        assert ledger.audit_log(W43) == []


class TestLeaseRecovery:
    def test_expired_claims_split_by_whether_an_attempt_was_open(self, ledger):
        a, b, c = frozen(ledger, 3)
        claims = {cl.key: cl for cl in ledger.claim_due(T0, "w1", LEASE, 10)}
        start_one(ledger, claims[a], T0)
        assert ledger.recover_expired_leases(T0 + LEASE - timedelta(seconds=1)).unknown == ()
        recovery = ledger.recover_expired_leases(T0 + LEASE)
        assert recovery.unknown == (a,)
        assert set(recovery.requeued) == {b, c}
        assert ledger.get(a).state is DeliveryState.UNKNOWN
        assert ledger.get(a).last_failure_class is FailureClass.UNKNOWN
        assert ledger.get(b).state is DeliveryState.RETRY_SCHEDULED
        assert ledger.get(b).next_attempt_at == T0 + LEASE
