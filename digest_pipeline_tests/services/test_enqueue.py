"""Enqueue: exactly one durable work item per selected customer, created idempotently."""

from datetime import timedelta

import pytest

from digest_pipeline.domain.errors import SnapshotMissing
from digest_pipeline.domain.model import EnqueueReceipt
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.services.enqueue import enqueue_period
from digest_pipeline_tests.builders import failed_invariants, frozen_ledger, key_of
from digest_pipeline_tests.conftest import T0, W42
from digest_pipeline_tests.fakes import FakeLedger


def test_one_pending_item_per_selected_customer(clock):
    ledger = frozen_ledger(3, enqueue=False)

    receipt = enqueue_period(ledger, clock, W42)

    assert receipt == EnqueueReceipt(created=3, existing=0)
    assert [(i.key, i.state) for i in ledger.items(W42)] == [
        (key_of(n), DeliveryState.PENDING) for n in (1, 2, 3)
    ]


def test_new_items_are_due_at_once(clock):
    ledger = frozen_ledger(2, enqueue=False)

    enqueue_period(ledger, clock, W42)

    assert {(i.created_at, i.next_attempt_at, i.attempts) for i in ledger.items(W42)} == {
        (T0, T0, 0)
    }


def test_rerun_creates_nothing_and_leaves_items_as_they_are(clock):
    ledger = frozen_ledger(3, enqueue=False)
    enqueue_period(ledger, clock, W42)
    before = ledger.items(W42)
    clock.advance(timedelta(hours=1))

    receipt = enqueue_period(ledger, clock, W42)

    assert receipt == EnqueueReceipt(created=0, existing=3)
    assert ledger.items(W42) == before


def test_rerun_does_not_reset_an_item_already_in_progress(clock):
    ledger = frozen_ledger(2, enqueue=False)
    enqueue_period(ledger, clock, W42)
    ledger.claim_due(clock.now(), "w1", timedelta(minutes=2), limit=1)

    enqueue_period(ledger, clock, W42)

    assert ledger.state_counts(W42) == {DeliveryState.CLAIMED: 1, DeliveryState.PENDING: 1}


def test_enqueue_before_the_snapshot_raises_snapshot_missing(clock):
    ledger = FakeLedger()

    with pytest.raises(SnapshotMissing):
        enqueue_period(ledger, clock, W42)

    assert ledger.items(W42) == []


def test_enqueue_touches_only_its_own_period(clock):
    ledger = frozen_ledger(2, enqueue=False)
    frozen_ledger(1, period=Period(2026, 43), enqueue=False, ledger=ledger)

    enqueue_period(ledger, clock, W42)

    assert ledger.items(Period(2026, 43)) == []
    assert len(ledger.items(W42)) == 2


def test_every_selected_customer_has_exactly_one_visible_item_after_enqueue(clock):
    ledger = frozen_ledger(25, enqueue=False)

    enqueue_period(ledger, clock, W42)
    enqueue_period(ledger, clock, W42)

    assert len(ledger.items(W42)) == 25
    assert failed_invariants(ledger, W42, clock.now()) == []
