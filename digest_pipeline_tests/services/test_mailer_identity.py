"""Evidence about an attempt counts only from the mailer that made it, over every ledger.

Each attempt records its mailer's identity. A process configured with another mailer asks that
mailer nothing about the attempt, resends nothing that only the first mailer would deduplicate,
and replays nothing on its word: the item waits for the mailer that made it, or for an operator.
"""

from dataclasses import replace
from datetime import timedelta

import pytest

from digest_pipeline.domain.delivery import NEEDS_MAILER
from digest_pipeline.domain.errors import PossibleDuplicateRefused
from digest_pipeline.domain.mailer_identity import (
    UNRECORDED,
    fingerprint,
    foreign_mailers,
    mailer_identity,
)
from digest_pipeline.domain.model import Attempt, Transition
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.ports import Ledger
from digest_pipeline.services.reconcile import reconcile_period
from digest_pipeline.services.replay import ReplayPlan, replay_keys
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
RELAY = mailer_identity("smtp", "relay.example", "587", "digest")
OUTBOX = mailer_identity("outbox", "/var/mail/digest")


class NamedMailer(FakeMailer):
    """A provider simulation under a given identity; its lookup knows only its own sends."""

    def __init__(self, identity: str, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._identity = identity

    @property
    def identity(self) -> str:
        return self._identity


def _deliveries(key: object, *mailers: FakeMailer) -> int:
    return sum(m.deliveries_for(str(key)) for m in mailers)


def _unknown_after_relay_stored_it(ledger: Ledger, clock: FixedClock, relay: NamedMailer) -> None:
    """The relay stored customer 1's digest, then the connection timed out: `unknown`."""
    seed_period(ledger, 1, now=clock.now())
    relay.script_timeout_after_accept(key_of(1))
    deliver_all(make_deliverer(ledger, relay, clock, policy=POLICY))
    assert state_of(ledger, key_of(1)) is DeliveryState.UNKNOWN
    assert [a.mailer for a in ledger.attempts(key_of(1))] == [RELAY]


def test_reconcile_under_another_mailer_leaves_the_item_for_the_mailer_that_made_it(ledger, clock):
    relay = NamedMailer(RELAY, clock=clock)
    _unknown_after_relay_stored_it(ledger, clock, relay)
    outbox = NamedMailer(OUTBOX, clock=clock)  # its lookup says "not found": it never saw it

    report = reconcile_period(ledger, outbox, clock, POLICY, W42)
    deliver_all(make_deliverer(ledger, outbox, clock, policy=POLICY))

    assert state_of(ledger, key_of(1)) is DeliveryState.UNKNOWN
    assert report.still_unknown == 1
    assert dict(report.needs_mailer) == {RELAY: 1}
    assert report.moved.total() == 0
    assert _deliveries(key_of(1), relay, outbox) == 1
    assert failed_invariants(ledger, W42, clock.now()) == []

    # the mailer that made the attempt has the evidence: its lookup finds the message
    settled = reconcile_period(ledger, relay, clock, POLICY, W42)
    assert dict(settled.evidence) == {"mailer_lookup_found": 1}
    assert state_of(ledger, key_of(1)) is DeliveryState.SENT
    assert _deliveries(key_of(1), relay, outbox) == 1


def test_a_resend_only_the_first_mailer_deduplicates_is_not_sent_through_another(ledger, clock):
    relay = NamedMailer(RELAY, clock=clock, can_lookup=False)
    _unknown_after_relay_stored_it(ledger, clock, relay)
    reconcile_period(ledger, relay, clock, POLICY, W42)  # the provider will deduplicate a resend
    assert state_of(ledger, key_of(1)) is DeliveryState.RETRY_SCHEDULED
    assert ledger.get(key_of(1)).dedupe_until is not None
    other = NamedMailer(OUTBOX, clock=clock, idempotent=False)

    deliver_all(make_deliverer(ledger, other, clock, policy=POLICY))

    item = ledger.get(key_of(1))
    assert item.state is DeliveryState.UNKNOWN
    assert item.last_detail == f"{NEEDS_MAILER}:{RELAY}"
    assert _deliveries(key_of(1), relay, other) == 1

    # back under the relay: resent inside its window, deduplicated, recorded as sent
    reconcile_period(ledger, relay, clock, POLICY, W42)
    deliver_all(make_deliverer(ledger, relay, clock, policy=POLICY))
    assert state_of(ledger, key_of(1)) is DeliveryState.SENT
    assert _deliveries(key_of(1), relay, other) == 1
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_replay_under_another_mailer_takes_no_evidence_from_its_lookup(ledger, clock):
    relay = NamedMailer(RELAY, clock=clock, can_lookup=False, idempotency_window=None)
    _unknown_after_relay_stored_it(ledger, clock, relay)
    clock.advance(POLICY.unknown_retention + timedelta(minutes=1))
    reconcile_period(ledger, relay, clock, POLICY, W42)
    assert state_of(ledger, key_of(1)) is DeliveryState.DEAD_LETTERED
    outbox = NamedMailer(OUTBOX, clock=clock)  # "not found" would read as proof of not sent

    dry = replay_keys(
        ledger, outbox, clock, W42, [key_of(1)], operator="ana", reason="r", dry_run=True
    )
    [line] = dry.lines
    assert line.plan is ReplayPlan.POSSIBLE_DUPLICATE
    assert line.evidence == f"needs_mailer:{RELAY}"
    with pytest.raises(PossibleDuplicateRefused):
        replay_keys(
            ledger, outbox, clock, W42, [key_of(1)], operator="ana", reason="r", dry_run=False
        )
    assert state_of(ledger, key_of(1)) is DeliveryState.DEAD_LETTERED


def _uncertain_attempt(ledger: Ledger, clock: FixedClock, mailer: str) -> None:
    """Claims customer 1, starts an attempt through `mailer`, and loses it mid-send."""
    [claim] = ledger.claim_due(clock.now(), "w1", POLICY.lease, 1, W42)
    start_one(ledger, claim, clock.now(), mailer=mailer)
    clock.advance(POLICY.lease + timedelta(seconds=1))
    assert ledger.recover_expired_leases(clock.now()).unknown == (key_of(1),)


@pytest.mark.parametrize(("second", "duplicates"), [(RELAY, 0), (OUTBOX, 1)])
def test_possible_deliveries_through_two_mailers_count_as_a_possible_duplicate(
    ledger, clock, second, duplicates
):
    seed_period(ledger, 1, now=clock.now())
    _uncertain_attempt(ledger, clock, RELAY)
    # moved back to the queue without evidence (as a reconcile under another mailer once did)
    item = ledger.get(key_of(1))
    ledger.apply(
        Transition(
            key_of(1),
            DeliveryState.UNKNOWN,
            item.lease_token,
            DeliveryState.RETRY_SCHEDULED,
            clock.now(),
            next_attempt_at=clock.now(),
        )
    )
    _uncertain_attempt(ledger, clock, second)

    [check] = ledger.check_invariants(W42, clock.now(), ["no_duplicate_send"])

    assert check.passed is (duplicates == 0)
    assert check.violations == duplicates


def test_an_attempt_recorded_without_its_mailer_counts_as_another_mailers():
    legacy = Attempt(1, key_of(1), 1, 1, "w", T0, T0, "unknown", "timeout_after_send", None, False)

    assert foreign_mailers([legacy], RELAY) == (UNRECORDED,)
    assert foreign_mailers([replace(legacy, mailer=RELAY)], RELAY) == ()
    # an attempt that closed as not accepted needs nobody's evidence
    assert foreign_mailers([replace(legacy, outcome="transient")], OUTBOX) == ()


def test_identities_tell_endpoints_apart_and_hold_no_credential():
    key = "re_live_secret_key"
    identity = mailer_identity("http", "https://api.resend.com", fingerprint(key))

    assert key not in identity
    assert identity != mailer_identity("http", "https://api.resend.com", fingerprint("re_2"))
    assert mailer_identity("smtp", "h", "25", "") != mailer_identity("smtp", "h", "2525", "")
