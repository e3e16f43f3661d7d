"""Eligibility: who is frozen for a period, and that a frozen selection never changes."""

from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest

from digest_pipeline.domain.catalogue import Order, Product
from digest_pipeline.domain.model import Customer, SnapshotEntry
from digest_pipeline.domain.periods import Period
from digest_pipeline.ports import CustomerSource
from digest_pipeline.services.enqueue import enqueue_period
from digest_pipeline.services.snapshot import take_snapshot
from digest_pipeline_tests.builders import (
    customer_id,
    email_of,
    failed_invariants,
    make_customer,
)
from digest_pipeline_tests.conftest import T0, W42
from digest_pipeline_tests.fakes import FakeCustomerSource, FakeLedger, FixedClock


class UnreadableSource(CustomerSource):
    """A source that must not be read: a re-run has to reuse the frozen selection."""

    def customers(self) -> Iterator[Customer]:
        raise AssertionError("the customer source was read again")

    def products(self) -> Iterator[Product]:
        raise AssertionError("the catalogue was read by the snapshot")

    def orders(self, since: datetime, until: datetime) -> Iterator[Order]:
        raise AssertionError("the orders were read by the snapshot")


def mixed_source() -> FakeCustomerSource:
    return FakeCustomerSource(
        [
            make_customer(1),
            make_customer(2, active=False),
            make_customer(3, opted_in=False),
            make_customer(4, active=False, opted_in=False),
            make_customer(5),
        ]
    )


def test_only_active_opted_in_customers_are_frozen_with_their_address(clock):
    ledger = FakeLedger()

    report = take_snapshot(mixed_source(), ledger, clock, W42, "run-1")

    assert ledger.snapshot_entries(W42) == [
        SnapshotEntry(customer_id(1), email_of(1)),
        SnapshotEntry(customer_id(5), email_of(5)),
    ]
    assert (report.reused, report.eligible, report.considered) == (False, 2, 5)


def test_freeze_records_the_period_run_id_and_selection_time(clock):
    ledger = FakeLedger()

    take_snapshot(mixed_source(), ledger, clock, W42, "run-1")

    info = ledger.snapshot(W42)
    assert info is not None
    assert (info.period, info.selection_run_id, info.selected_at, info.eligible_count) == (
        W42,
        "run-1",
        T0,
        2,
    )


def test_rerun_reuses_the_frozen_selection_without_reading_the_source(clock):
    ledger = FakeLedger()
    take_snapshot(mixed_source(), ledger, clock, W42, "run-1")
    clock.advance(timedelta(hours=1))

    report = take_snapshot(UnreadableSource(), ledger, clock, W42, "run-2")

    assert (report.reused, report.eligible, report.considered) == (True, 2, 0)
    assert (report.selection_run_id, report.selected_at) == ("run-1", T0)


@pytest.mark.parametrize(
    "change",
    [
        make_customer(1, active=False),  # a selected customer turns inactive mid-run
        make_customer(1, opted_in=False),  # a selected customer opts out mid-run
        make_customer(1, email="moved@elsewhere.example"),  # a selected customer changes address
        make_customer(3),  # an unselected customer opts in after the freeze
        make_customer(9),  # a customer signs up after the freeze
    ],
)
def test_source_changes_after_the_freeze_do_not_change_the_selection(clock, change):
    source, ledger = mixed_source(), FakeLedger()
    take_snapshot(source, ledger, clock, W42, "run-1")
    before = ledger.snapshot_entries(W42)

    source.update(change)
    take_snapshot(source, ledger, clock, W42, "run-2")

    assert ledger.snapshot_entries(W42) == before
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_a_customer_who_opts_in_after_the_freeze_is_selected_next_period(clock):
    source, ledger = mixed_source(), FakeLedger()
    take_snapshot(source, ledger, clock, W42, "run-1")
    source.update(make_customer(3))

    take_snapshot(source, ledger, clock, Period(2026, 43), "run-43")

    assert customer_id(3) in {e.customer_id for e in ledger.snapshot_entries(Period(2026, 43))}
    assert customer_id(3) not in {e.customer_id for e in ledger.snapshot_entries(W42)}


@pytest.mark.parametrize(
    "bad_id",
    [
        "has space",  # whitespace breaks headers and logs
        "has:colon",  # a colon would split the operation key
        "",  # empty
        "-leading-dash",  # must start with a letter or digit
        "x" * 129,  # longer than 128 characters
    ],
)
def test_invalid_customer_ids_are_left_out_and_counted(clock, bad_id):
    source = FakeCustomerSource(
        [make_customer(1), Customer(bad_id, "bad@mailbox.example", True, True)]
    )
    ledger = FakeLedger()

    report = take_snapshot(source, ledger, clock, W42, "run-1")

    assert [e.customer_id for e in ledger.snapshot_entries(W42)] == [customer_id(1)]
    assert (report.eligible, report.invalid_ids, report.considered) == (1, 1, 2)


def test_an_empty_selection_is_frozen_too(clock):
    ledger = FakeLedger()
    source = FakeCustomerSource([make_customer(1, active=False)])

    take_snapshot(source, ledger, clock, W42, "run-1")
    report = take_snapshot(mixed_source(), ledger, clock, W42, "run-2")

    assert (report.reused, report.eligible) == (True, 0)
    assert ledger.snapshot_entries(W42) == []


def test_frozen_selection_survives_enqueue_and_passes_every_invariant(clock):
    ledger = FakeLedger()
    take_snapshot(mixed_source(), ledger, clock, W42, "run-1")

    enqueue_period(ledger, clock, W42)

    assert failed_invariants(ledger, W42, clock.now()) == []


def test_fixed_clock_is_the_selection_time_not_the_wall_clock():
    ledger, clock = FakeLedger(), FixedClock(T0 + timedelta(days=1))

    report = take_snapshot(mixed_source(), ledger, clock, W42, "run-1")

    assert report.selected_at == T0 + timedelta(days=1)
