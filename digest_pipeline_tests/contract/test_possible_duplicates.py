"""Possible duplicates, on every ledger: the replay gate and invariant 4 read the same history.

A key an attempt may have delivered (outcome `unknown`, or abandoned mid-send) with no later
evidence that it did not is replayed only with the operator's explicit acceptance, and a second
send after that counts in `no_duplicate_send` and `duplicate_sends`. Histories that
reconciliation settled honestly (a lookup that found nothing, a resend the provider deduplicated,
an operator's "not sent") count one send.
"""

from datetime import timedelta

import pytest

from digest_pipeline.domain.errors import PossibleDuplicateRefused, ReplayRefused
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import AuditNote, Reopen, Transition
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.ports import Ledger
from digest_pipeline.services.metrics import period_metrics
from digest_pipeline.services.reconcile import reconcile_period
from digest_pipeline.services.replay import ReplayPlan, ReplayReport, replay_keys
from digest_pipeline.services.resolve import resolve_unknown
from digest_pipeline_tests.builders import (
    deliver_all,
    failed_invariants,
    key_of,
    make_deliverer,
    seed_period,
    start_one,
    state_of,
)
from digest_pipeline_tests.conftest import T0, W42
from digest_pipeline_tests.fakes import FakeMailer, FixedClock

POLICY = DeliveryPolicy()
KEY = key_of(1)
#: the provider refuses the resend: same key, other payload (Resend's 409)
CONFLICT = SendOutcome.failed(FailureClass.PERMANENT, "http:409:invalid_idempotent_request")
#: a read timeout the provider never saw
LOST = SendOutcome.failed(FailureClass.UNKNOWN, "http:read_timeout")


def deliver(ledger: Ledger, mailer: FakeMailer, clock: FixedClock) -> None:
    deliver_all(make_deliverer(ledger, mailer, clock, policy=POLICY))


def reconcile(ledger: Ledger, mailer: FakeMailer, clock: FixedClock) -> None:
    reconcile_period(ledger, mailer, clock, POLICY, W42)


def replay(ledger: Ledger, mailer: FakeMailer, clock: FixedClock, **flags: bool) -> ReplayReport:
    return replay_keys(
        ledger,
        mailer,
        clock,
        W42,
        [KEY],
        operator="ana",
        reason="customer asked OPS-9",
        dry_run=flags.get("dry_run", False),
        accept_possible_duplicate=flags.get("accept_possible_duplicate", False),
    )


def duplicate_counters(ledger: Ledger, clock: FixedClock) -> tuple[int, tuple[str, ...], int]:
    """(invariant 4's violations, its sample, the `duplicate_sends` metric)."""
    [r] = ledger.check_invariants(W42, clock.now(), names={"no_duplicate_send"})
    return r.violations, r.sample, period_metrics(ledger, W42, clock.now()).duplicate_sends


def unknown_unresolved_after_a_409(ledger: Ledger, clock: FixedClock) -> FakeMailer:
    """The provider accepted the first send, the caller timed out; the idempotent resend inside
    the window got a 409, so the key is dead-lettered `unknown_unresolved`. The mailer (like the
    HTTP provider) cannot look keys up and deduplicates for 24 h."""
    seed_period(ledger, 1, now=clock.now())
    mailer = FakeMailer(can_lookup=False, clock=clock)
    mailer.script(KEY, FakeMailer.ACCEPTED_THEN_TIMEOUT, CONFLICT)
    deliver(ledger, mailer, clock)
    clock.advance(timedelta(minutes=1))
    reconcile(ledger, mailer, clock)  # idempotent resend: inside the provider's window
    deliver(ledger, mailer, clock)
    assert state_of(ledger, KEY) is DeliveryState.DEAD_LETTERED
    assert [d.reason for d in ledger.dead_letters(W42)] == ["unknown_unresolved"]
    assert mailer.deliveries_for(KEY) == 1
    return mailer


# --- end to end: an unknown outcome, its replay and the possible duplicate -------------------


def test_replay_after_the_dedupe_window_needs_acceptance_and_then_counts_a_duplicate(ledger, clock):
    mailer = unknown_unresolved_after_a_409(ledger, clock)
    clock.advance(timedelta(hours=25))  # the provider no longer deduplicates the key
    before = (ledger.items(W42), ledger.audit_log(W42), ledger.dead_letters(W42))

    with pytest.raises(PossibleDuplicateRefused) as refused:
        replay(ledger, mailer, clock)

    assert str(KEY) in str(refused.value)
    assert "nothing changed" in str(refused.value)
    assert isinstance(refused.value, ReplayRefused)  # the CLI's exit 2, one line
    assert (ledger.items(W42), ledger.audit_log(W42), ledger.dead_letters(W42)) == before

    report = replay(ledger, mailer, clock, accept_possible_duplicate=True)
    deliver(ledger, mailer, clock)

    assert [line.plan for line in report.lines] == [ReplayPlan.POSSIBLE_DUPLICATE]
    assert state_of(ledger, KEY) is DeliveryState.SENT
    assert mailer.deliveries_for(KEY) == 2  # the customer got a second copy
    assert duplicate_counters(ledger, clock) == (1, (str(KEY),), 1)
    assert [r.name for r in failed_invariants(ledger, W42, clock.now())] == ["no_duplicate_send"]


def test_the_dry_run_shows_the_attempt_that_may_have_delivered(ledger, clock):
    mailer = unknown_unresolved_after_a_409(ledger, clock)
    clock.advance(timedelta(hours=25))
    before = (ledger.items(W42), ledger.audit_log(W42))

    report = replay(ledger, mailer, clock, dry_run=True)

    [line] = report.lines
    assert (line.plan, line.evidence) == (
        ReplayPlan.POSSIBLE_DUPLICATE,
        "mailer_lookup_unsupported",
    )
    assert line.possible_send is not None
    assert (line.possible_send.number, line.possible_send.outcome) == (1, "unknown")
    assert line.possible_send.started_at == T0
    assert line.possible_send.detail == "timeout_after_send"
    assert report.replayed == 0
    assert report.possible_duplicates == (KEY,)
    assert (ledger.items(W42), ledger.audit_log(W42)) == before


def test_an_accepted_replay_is_audited_as_a_possible_duplicate(ledger, clock):
    mailer = unknown_unresolved_after_a_409(ledger, clock)
    clock.advance(timedelta(hours=25))

    replay(ledger, mailer, clock, accept_possible_duplicate=True)

    last = ledger.audit_log(W42)[-1]
    assert (last.actor, last.action, last.key, last.from_state, last.to_state) == (
        "ana",
        "replay_possible_duplicate",
        KEY,
        DeliveryState.DEAD_LETTERED,
        DeliveryState.PENDING,
    )
    assert last.reason.startswith("customer asked OPS-9 (operator accepted a possible duplicate: ")
    assert "attempt 1 unknown (timeout_after_send)" in last.reason


def test_an_abandoned_attempt_counts_as_a_possible_send(ledger, clock):
    """The worker died mid-send (its attempt never closed); no window, no lookup (SMTP)."""
    seed_period(ledger, 1, now=clock.now())
    mailer = FakeMailer(idempotent=False, can_lookup=False, clock=clock)
    [claim] = ledger.claim_due(clock.now(), "w-dead", POLICY.lease, 1)
    start_one(ledger, claim, clock.now())
    clock.advance(POLICY.lease)
    ledger.recover_expired_leases(clock.now())
    clock.advance(POLICY.unknown_retention)
    reconcile(ledger, mailer, clock)
    assert state_of(ledger, KEY) is DeliveryState.DEAD_LETTERED

    with pytest.raises(PossibleDuplicateRefused):
        replay(ledger, mailer, clock)
    replay(ledger, mailer, clock, accept_possible_duplicate=True)
    deliver(ledger, mailer, clock)

    assert duplicate_counters(ledger, clock) == (1, (str(KEY),), 1)


# --- honest histories count one send ----------------------------------------------------------


def test_an_unknown_the_lookup_did_not_find_then_a_resend_is_one_send(ledger, clock):
    seed_period(ledger, 1, now=clock.now())
    mailer = FakeMailer(can_lookup=True, clock=clock)
    mailer.script(KEY, LOST)
    deliver(ledger, mailer, clock)
    reconcile(ledger, mailer, clock)  # lookup: not found
    deliver(ledger, mailer, clock)

    assert state_of(ledger, KEY) is DeliveryState.SENT
    assert duplicate_counters(ledger, clock) == (0, (), 0)


def test_a_resend_the_provider_deduplicated_is_one_send(ledger, clock):
    seed_period(ledger, 1, now=clock.now())
    mailer = FakeMailer(can_lookup=False, clock=clock)
    mailer.script_timeout_after_accept(KEY)
    deliver(ledger, mailer, clock)
    reconcile(ledger, mailer, clock)  # idempotent resend inside the window
    deliver(ledger, mailer, clock)

    assert [a.duplicate for a in ledger.attempts(KEY)] == [False, True]
    assert mailer.deliveries_for(KEY) == 1
    assert duplicate_counters(ledger, clock) == (0, (), 0)


def test_a_resend_inside_the_window_is_one_send_even_unflagged(ledger, clock):
    """The HTTP provider answers a deduplicated request like the first: no duplicate flag."""
    seed_period(ledger, 1, now=clock.now())
    mailer = FakeMailer(can_lookup=False, clock=clock)
    mailer.script(KEY, FakeMailer.ACCEPTED_THEN_TIMEOUT, SendOutcome.sent("msg-1"))
    deliver(ledger, mailer, clock)
    reconcile(ledger, mailer, clock)
    deliver(ledger, mailer, clock)

    assert [(a.outcome, a.duplicate) for a in ledger.attempts(KEY)] == [
        ("unknown", False),
        ("sent", False),
    ]
    assert duplicate_counters(ledger, clock) == (0, (), 0)
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_an_unknown_an_operator_resolved_not_sent_then_a_resend_is_one_send(ledger, clock):
    seed_period(ledger, 1, now=clock.now())
    mailer = FakeMailer(idempotent=False, can_lookup=False, clock=clock)
    mailer.script(KEY, LOST)
    deliver(ledger, mailer, clock)
    clock.advance(timedelta(minutes=5))
    resolve_unknown(
        ledger, clock, KEY, sent=False, reason="relay log: never arrived", operator="bo"
    )
    deliver(ledger, mailer, clock)

    assert state_of(ledger, KEY) is DeliveryState.SENT
    assert duplicate_counters(ledger, clock) == (0, (), 0)


def test_a_replay_the_lookup_cleared_needs_no_acceptance_and_is_one_send(ledger, clock):
    """Dead-lettered `unknown_unresolved` through an SMTP relay; at replay time the operator's
    mailer can look keys up and finds nothing."""
    seed_period(ledger, 1, now=clock.now())
    relay = FakeMailer(idempotent=False, can_lookup=False, clock=clock)
    relay.script(KEY, LOST)
    deliver(ledger, relay, clock)
    clock.advance(POLICY.unknown_retention)
    reconcile(ledger, relay, clock)
    assert state_of(ledger, KEY) is DeliveryState.DEAD_LETTERED
    provider = FakeMailer(can_lookup=True, clock=clock)

    report = replay(ledger, provider, clock)
    deliver(ledger, provider, clock)

    assert [(line.plan, line.evidence) for line in report.lines] == [
        (ReplayPlan.REPLAY, "mailer_lookup_not_found")
    ]
    assert state_of(ledger, KEY) is DeliveryState.SENT
    assert duplicate_counters(ledger, clock) == (0, (), 0)


def test_a_replay_of_a_key_never_accepted_needs_no_acceptance(ledger, clock):
    seed_period(ledger, 1, now=clock.now())
    mailer = FakeMailer(can_lookup=False, clock=clock)
    mailer.script(KEY, SendOutcome.failed(FailureClass.PERMANENT, "smtp:550"))
    deliver(ledger, mailer, clock)

    report = replay(ledger, mailer, clock)
    deliver(ledger, mailer, clock)

    assert [line.plan for line in report.lines] == [ReplayPlan.REPLAY]
    assert duplicate_counters(ledger, clock) == (0, (), 0)


def test_a_second_send_after_any_replay_of_a_possible_duplicate_is_counted(ledger, clock):
    """The counters judge the history, not the flag: a replay that reopened the key without
    the acceptance (as one did before the gate existed) still counts."""
    mailer = unknown_unresolved_after_a_409(ledger, clock)
    clock.advance(timedelta(hours=25))
    item = ledger.get(KEY)
    assert item is not None
    ledger.apply(
        Transition(
            KEY,
            DeliveryState.DEAD_LETTERED,
            item.lease_token,
            DeliveryState.PENDING,
            clock.now(),
            next_attempt_at=clock.now(),
            effects=(Reopen(),),
            audit=AuditNote("ana", "replay", "OPS-9 (mailer_lookup_unsupported)"),
        )
    )
    deliver(ledger, mailer, clock)

    assert mailer.deliveries_for(KEY) == 2
    assert duplicate_counters(ledger, clock) == (1, (str(KEY),), 1)
