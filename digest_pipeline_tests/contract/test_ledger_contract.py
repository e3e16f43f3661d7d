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
    Claim,
    CleanupMode,
    ClearDedupe,
    DigestRow,
    RefundBudget,
    Reopen,
    ResendUntil,
    SnapshotEntry,
    Transition,
    WriteDeadLetter,
)
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.ports import Ledger
from digest_pipeline_tests.builders import clean_one, complete_one, recipient_of, rows_of, start_one
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


class TestCleanup:
    @pytest.mark.parametrize("mode", list(CleanupMode))
    def test_cleanup_removes_only_that_keys_rows_once(self, ledger, mode):
        a, b, _ = frozen(ledger, 3)
        ledger.add_digest_rows(
            [DigestRow(a, i, {"title": f"pick {i}"}) for i in range(3)] + [DigestRow(b, 0, {})]
        )
        claims = {cl.key: cl for cl in ledger.claim_due(T0, "w1", LEASE, 10)}
        send(ledger, claims[a], SendOutcome.sent("pm"), DeliveryState.SENT)
        first = clean_one(ledger, a, claims[a].token, mode, T0)
        again = clean_one(ledger, a, claims[a].token, mode, T0)
        assert (first.status, first.rows) == ("cleaned", 3)
        assert (again.status, again.rows) == ("already_cleaned", 0)
        assert rows_of(ledger, a) == []
        assert len(rows_of(ledger, b)) == 1
        assert ledger.get(a).state is DeliveryState.CLEANED

    def test_cleanup_of_an_unsent_item_is_refused_and_keeps_its_rows(self, ledger):
        a = frozen(ledger, 1)[0]
        ledger.add_digest_rows([DigestRow(a, 0, {"title": "x"})])
        c = claim_one(ledger, a)
        time_out(ledger, c)
        with pytest.raises(LostRace):
            clean_one(ledger, a, c.token, CleanupMode.DELETE, T0)
        assert len(rows_of(ledger, a)) == 1
        assert ledger.get(a).state is DeliveryState.UNKNOWN
        # the refused cleanup left no claim behind: once sent, it cleans normally
        ledger.apply(Transition(a, DeliveryState.UNKNOWN, c.token, DeliveryState.SENT, T0))
        assert clean_one(ledger, a, c.token, CleanupMode.DELETE, T0).status == "cleaned"


class TestReads:
    def test_due_count_counts_what_a_claim_could_take(self, ledger):
        frozen(ledger, 3, W42)
        frozen(ledger, 2, W43)
        assert ledger.due_count(T0) == 5
        assert ledger.due_count(T0, W43) == 2
        ledger.claim_due(T0, "w1", LEASE, 2, W42)
        assert ledger.due_count(T0, W42) == 1
        assert ledger.due_count(T0 - timedelta(seconds=1)) == 0

    def test_keys_with_rows_are_those_with_live_generated_rows(self, ledger):
        a, b, _ = frozen(ledger, 3)
        ledger.add_digest_rows([DigestRow(a, 0, {"title": "x"}), DigestRow(b, 0, {})])
        assert ledger.keys_with_rows(W42) == {a, b}
        c = claim_one(ledger, a)
        send(ledger, c, SendOutcome.sent("pm"), DeliveryState.SENT)
        clean_one(ledger, a, c.token, CleanupMode.ARCHIVE, T0)
        assert ledger.keys_with_rows(W42) == {b}
        assert ledger.keys_with_rows(W43) == set()

    def test_open_periods_are_those_with_work_left(self, ledger):
        a = frozen(ledger, 1, W42)[0]
        frozen(ledger, 1, W43)
        c = claim_one(ledger, a)
        send(ledger, c, SendOutcome.sent("pm"), DeliveryState.SENT)
        assert ledger.open_periods() == [W42, W43]
        clean_one(ledger, a, c.token, CleanupMode.DELETE, T0)
        assert ledger.open_periods() == [W43]

    def test_items_can_be_filtered_by_state(self, ledger):
        a, b = frozen(ledger, 2)
        [c] = ledger.claim_due(T0, "w1", LEASE, 1)  # oldest due first, then by key
        assert c.key == a
        assert [i.key for i in ledger.items(W42, [DeliveryState.PENDING])] == [b]
        assert ledger.state_counts(W42) == {DeliveryState.CLAIMED: 1, DeliveryState.PENDING: 1}


class TestInvariants:
    def test_a_healthy_period_passes_every_invariant(self, ledger):
        a, b, c = frozen(ledger, 3)
        claims = {cl.key: cl for cl in ledger.claim_due(T0, "w1", LEASE, 10)}
        send(ledger, claims[a], SendOutcome.sent("pm"), DeliveryState.SENT)
        clean_one(ledger, a, claims[a].token, CleanupMode.ARCHIVE, T0)
        time_out(ledger, claims[b])
        send(
            ledger,
            claims[c],
            SendOutcome.failed(FailureClass.TRANSIENT, "451"),
            DeliveryState.RETRY_SCHEDULED,
            next_attempt_at=T0 + timedelta(minutes=1),
        )
        results = ledger.check_invariants(W42, T0)
        assert [r.name for r in results] == [
            "at_most_one_cleanup_per_key",
            "no_silent_timeout",
            "every_customer_has_visible_state",
            "no_duplicate_send",
            "snapshot_unchanged",
        ]
        assert all(r.passed for r in results), results

    def test_a_timeout_moved_on_without_reconciliation_is_detected(self, ledger):
        a = frozen(ledger, 1)[0]
        c = claim_one(ledger, a)
        time_out(ledger, c)
        # a move out of `unknown` with no reconcile/resolve audit row is a silent timeout
        ledger.apply(
            Transition(
                a,
                DeliveryState.UNKNOWN,
                c.token,
                DeliveryState.RETRY_SCHEDULED,
                T0,
                next_attempt_at=T0,
            )
        )
        result = {r.name: r for r in ledger.check_invariants(W42, T0)}["no_silent_timeout"]
        assert (result.passed, result.sample) == (False, (str(a),))

    def test_a_reconciled_timeout_passes(self, ledger):
        a = frozen(ledger, 1)[0]
        c = claim_one(ledger, a)
        time_out(ledger, c)
        ledger.apply(
            Transition(
                a,
                DeliveryState.UNKNOWN,
                c.token,
                DeliveryState.SENT,
                T0,
                audit=AuditNote("system:reconcile", "reconcile", "evidence:mailer_lookup_found"),
            )
        )
        assert all(r.passed for r in ledger.check_invariants(W42, T0))

    def test_a_second_confirmed_send_of_one_key_is_detected(self, ledger):
        a = frozen(ledger, 1)[0]
        c = claim_one(ledger, a)
        ticket = start_one(ledger, c, T0)
        ledger.recover_expired_leases(T0 + LEASE)  # the send outlived its lease: unknown
        late = T0 + LEASE + timedelta(seconds=1)
        with pytest.raises(LostRace):  # ...and then arrived; the attempt records it
            complete_one(
                ledger,
                ticket,
                SendOutcome.sent("pm-1"),
                Transition(a, DeliveryState.CLAIMED, c.token, DeliveryState.SENT, late),
            )
        # the operator wrongly resolves "not sent" without reading the attempt history
        ledger.apply(
            Transition(
                a,
                DeliveryState.UNKNOWN,
                c.token,
                DeliveryState.RETRY_SCHEDULED,
                late,
                next_attempt_at=late,
                audit=AuditNote("alice", "resolve", "looked lost"),
            )
        )
        again = claim_one(ledger, a, now=late, owner="w2")
        send(ledger, again, SendOutcome.sent("pm-2"), DeliveryState.SENT, now=late)
        results = {r.name: r for r in ledger.check_invariants(W42, late)}
        assert (
            results["no_duplicate_send"].passed,
            results["no_duplicate_send"].sample,
        ) == (
            False,
            (str(a),),
        )
        assert results["no_silent_timeout"].passed

    def test_invariants_can_be_evaluated_by_name(self, ledger):
        frozen(ledger, 1)
        only = ledger.check_invariants(W42, T0, names={"snapshot_unchanged", "no_silent_timeout"})
        assert [r.name for r in only] == ["no_silent_timeout", "snapshot_unchanged"]

    def test_a_stuck_claim_is_not_visible(self, ledger):
        frozen(ledger, 1)
        ledger.claim_due(T0, "w1", LEASE, 10)
        results = {r.name: r for r in ledger.check_invariants(W42, T0 + LEASE)}
        assert not results["every_customer_has_visible_state"].passed
        ledger.recover_expired_leases(T0 + LEASE)
        results = {r.name: r for r in ledger.check_invariants(W42, T0 + LEASE)}
        assert results["every_customer_has_visible_state"].passed
