"""One-click unsubscribes and provider events as use cases (`services/feedback.py`), on fakes.

A delivered week of five customers: 1-3 `sent` with a provider message id, 4-5 `unknown`
(the provider accepted, the worker saw a timeout). Events settle or confirm them, suppress a
customer on a hard bounce or complaint, and are applied once per event id.
"""

import logging
from datetime import timedelta

import pytest

from digest_pipeline.domain.feedback import (
    EventOutcome,
    EventRecord,
    EventType,
    ProviderEvent,
    Suppression,
    SuppressionReason,
)
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.domain.reconciliation import Evidence
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.domain.unsubscribe import unsubscribe_token
from digest_pipeline.services.feedback import (
    EVENT_LEASE,
    PROVIDER_EVENT_ACTOR,
    EventResult,
    LinkCheck,
    Unsubscribed,
    check_link,
    record_event,
    unsubscribe,
)
from digest_pipeline_tests.builders import (
    customer_id,
    deliver_all,
    failed_invariants,
    frozen_ledger,
    key_of,
    make_deliverer,
    state_of,
)
from digest_pipeline_tests.conftest import T0, W42
from digest_pipeline_tests.fakes import FakeLedger, FakeMailer, FixedClock
from digest_pipeline_tests.feedback_fakes import FakeFeedbackStore

SECRET = "a-private-secret-for-tests"
SENT, UNKNOWN = (1, 2, 3), (4, 5)


class World:
    def __init__(self) -> None:
        self.clock = FixedClock(T0)
        self.ledger: FakeLedger = frozen_ledger(5)
        self.mailer = FakeMailer(clock=self.clock, can_lookup=False)
        for n in UNKNOWN:
            self.mailer.script_timeout_after_accept(key_of(n))
        deliver_all(make_deliverer(self.ledger, self.mailer, self.clock))
        self.store = FakeFeedbackStore(self.ledger)
        self.message_ids = {k: pid for k, pid, _ in self.mailer.deliveries}

    def event(
        self,
        n: int,
        event_type: EventType,
        event_id: str = "msg_1",
        *,
        by_message_id: bool = True,
        by_key: bool = True,
    ) -> ProviderEvent:
        key = key_of(n)
        return ProviderEvent(
            "resend",
            event_id,
            event_type,
            self.message_ids.get(str(key)) if by_message_id else None,
            key if by_key else None,
        )

    def record(self, event: ProviderEvent):
        return record_event(self.store, self.ledger, self.ledger, self.clock, event)

    def unsubscribe(self, customer_id: str, token: str | None = None):
        token = unsubscribe_token(SECRET, customer_id) if token is None else token
        return unsubscribe(self.store, self.clock, SECRET, customer_id, token)


@pytest.fixture
def world() -> World:
    w = World()
    assert [state_of(w.ledger, key_of(n)) for n in (*SENT, *UNKNOWN)] == [
        DeliveryState.SENT
    ] * 3 + [DeliveryState.UNKNOWN] * 2
    return w


class TestUnsubscribe:
    def test_a_valid_link_suppresses_the_customer_once(self, world):
        assert world.unsubscribe("customer-0001") is Unsubscribed.NOW
        assert world.unsubscribe("customer-0001") is Unsubscribed.ALREADY
        assert world.store.suppressions() == [
            Suppression("customer-0001", SuppressionReason.UNSUBSCRIBED, "one_click", T0)
        ]

    def test_a_forged_or_cross_customer_token_is_forbidden_before_existence_is_asked(self, world):
        other = unsubscribe_token(SECRET, "customer-0002")
        assert world.unsubscribe("customer-0001", other) is LinkCheck.FORBIDDEN
        assert world.unsubscribe("customer-0001", "0" * 32) is LinkCheck.FORBIDDEN
        # an id nobody knows gets the very same answer without a valid token
        assert world.unsubscribe("customer-0404", "0" * 32) is LinkCheck.FORBIDDEN
        assert world.store.suppressions() == []

    def test_a_valid_token_for_an_unknown_customer_is_unknown(self, world):
        assert world.unsubscribe("customer-0404") is LinkCheck.UNKNOWN_CUSTOMER
        assert world.store.suppressions() == []

    def test_checking_a_link_changes_nothing(self, world):
        token = unsubscribe_token(SECRET, "customer-0001")
        assert check_link(world.store, SECRET, "customer-0001", token) is LinkCheck.VALID
        assert world.store.suppressions() == []


class TestProviderEvents:
    def test_delivered_settles_an_unknown_item_as_sent_on_provider_evidence(self, world):
        key = key_of(4)
        result = world.record(world.event(4, EventType.DELIVERED, by_message_id=False))
        assert result == (EventResult.APPLIED, EventOutcome.SETTLED_SENT)
        item = world.ledger.get(key)
        assert item is not None
        assert (item.state, item.last_detail) == (
            DeliveryState.SENT,
            f"reconciled:{Evidence.PROVIDER_EVENT.value}",
        )
        (audit,) = [a for a in world.ledger.audit_log(W42) if a.key == key]
        assert (audit.actor, audit.action, audit.reason) == (
            PROVIDER_EVENT_ACTOR,
            "reconcile",
            "evidence:provider_event",
        )
        assert failed_invariants(world.ledger, W42, world.clock.now()) == []

    def test_the_same_event_twice_is_applied_once(self, world):
        event = world.event(5, EventType.DELIVERED, "msg_5", by_message_id=False)
        assert world.record(event) == (EventResult.APPLIED, EventOutcome.SETTLED_SENT)
        world.clock.advance(timedelta(hours=1))
        assert world.record(event) == (EventResult.DUPLICATE, EventOutcome.SETTLED_SENT)
        settled = [t for t in world.ledger.transitions if t.key == key_of(5) and t.audit]
        assert [t.target for t in settled] == [DeliveryState.SENT]
        assert [a.key for a in world.ledger.audit_log(W42)].count(key_of(5)) == 1
        assert len(world.store.provider_events()) == 1

    def test_delivered_for_a_sent_item_confirms_it_and_changes_nothing(self, world):
        before = world.ledger.get(key_of(1))
        assert world.record(world.event(1, EventType.DELIVERED)) == (
            EventResult.APPLIED,
            EventOutcome.CONFIRMED,
        )
        assert world.ledger.get(key_of(1)) == before

    @pytest.mark.parametrize(
        ("event_type", "reason"),
        [
            (EventType.HARD_BOUNCE, SuppressionReason.HARD_BOUNCE),
            (EventType.COMPLAINT, SuppressionReason.COMPLAINT),
        ],
    )
    def test_a_hard_bounce_or_complaint_of_a_sent_item_suppresses_the_customer(
        self, world, event_type, reason
    ):
        before = world.ledger.get(key_of(2))
        # matched by the provider's message id alone, as a Resend event names it
        event = world.event(2, event_type, "msg_2", by_key=False)
        assert world.record(event) == (EventResult.APPLIED, EventOutcome.SUPPRESSED)
        assert world.store.suppressions() == [
            Suppression("customer-0002", reason, "provider:resend:msg_2", T0)
        ]
        assert world.ledger.get(key_of(2)) == before
        again = world.event(2, EventType.COMPLAINT, "msg_3", by_key=False)
        assert world.record(again) == (EventResult.APPLIED, EventOutcome.ALREADY_SUPPRESSED)

    def test_a_soft_bounce_is_recorded_only(self, world):
        assert world.record(world.event(3, EventType.SOFT_BOUNCE)) == (
            EventResult.APPLIED,
            EventOutcome.RECORDED,
        )
        assert world.store.suppressions() == []
        assert state_of(world.ledger, key_of(3)) is DeliveryState.SENT

    def test_an_event_for_no_item_is_recorded_unmatched(self, world):
        stray = world.event(9, EventType.COMPLAINT, "msg_9")
        assert world.record(stray) == (EventResult.APPLIED, EventOutcome.UNMATCHED)
        assert world.store.suppressions() == []
        (stored,) = world.store.provider_events()
        assert stored.outcome is EventOutcome.UNMATCHED

    def test_an_event_that_names_no_work_item_is_a_step_line(self, world, caplog):
        # a line about one item goes to `digest_pipeline.items`, which Dagster's run log leaves
        # out; one that names no item has no key to trace it by, so it is the webhook's line
        caplog.set_level(logging.INFO, logger="digest_pipeline")
        nameless = ProviderEvent("resend", "msg_90", EventType.DELIVERED, "unknown_id", None)
        assert world.record(nameless) == (EventResult.APPLIED, EventOutcome.UNMATCHED)
        assert world.record(world.event(3, EventType.DELIVERED, "msg_91"))[0] is EventResult.APPLIED

        lines = [
            (r.name, "key=" in r.getMessage())
            for r in caplog.records
            if r.getMessage().startswith("event=provider_event ")
        ]
        assert lines == [("digest_pipeline.steps", False), ("digest_pipeline.items", True)]

    def test_an_event_of_another_instances_key_is_not_ours(self, world):
        # another digest instance on the same provider account: its events reach us too
        theirs = OperationKey(W42, customer_id(4), "vip_digest")
        before = world.ledger.get(key_of(4))
        for event_id, event_type in (
            ("msg_41", EventType.DELIVERED),
            ("msg_42", EventType.COMPLAINT),
        ):
            event = ProviderEvent("resend", event_id, event_type, None, theirs)
            assert world.record(event) == (EventResult.APPLIED, EventOutcome.UNMATCHED)
        assert world.ledger.get(key_of(4)) == before
        assert world.store.suppressions() == []
        assert {e.operation_key for e in world.store.provider_events()} == {theirs}

    def test_an_event_another_request_is_applying_is_left_to_the_providers_retry(self, world):
        event = world.event(4, EventType.DELIVERED, by_message_id=False)
        world.store.begin_event(_received(world, event), EVENT_LEASE)  # a request in flight
        assert world.record(event) == (EventResult.IN_PROGRESS, None)
        assert state_of(world.ledger, key_of(4)) is DeliveryState.UNKNOWN

    def test_an_event_a_crash_left_half_done_is_resumed_after_its_lease(self, world):
        event = world.event(4, EventType.DELIVERED, by_message_id=False)
        world.store.begin_event(_received(world, event), EVENT_LEASE)  # then the process died
        world.clock.advance(EVENT_LEASE + timedelta(seconds=1))
        assert world.record(event) == (EventResult.APPLIED, EventOutcome.SETTLED_SENT)
        assert state_of(world.ledger, key_of(4)) is DeliveryState.SENT


def _received(world: World, event: ProviderEvent) -> EventRecord:
    return EventRecord(
        event.provider,
        event.event_id,
        event.type,
        event.operation_key,
        event.provider_message_id,
        world.clock.now(),
        EventOutcome.RECEIVED,
    )
