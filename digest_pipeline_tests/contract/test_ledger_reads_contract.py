"""The ledger contract, continued: cleanup, the read model and the invariant queries, over the fake,
SQLite and PostgreSQL."""

from datetime import timedelta

import pytest

from digest_pipeline.domain.errors import (
    LostRace,
)
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import (
    AuditNote,
    CleanupMode,
    DigestRow,
    Transition,
)
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline_tests.builders import clean_one, complete_one, rows_of, start_one
from digest_pipeline_tests.conftest import T0, W42
from digest_pipeline_tests.contract.ledger_steps import (
    LEASE,
    W43,
    claim_one,
    frozen,
    send,
    time_out,
)


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
