"""The cleanup gate: only `sent` items lose their generated rows, exactly once per key."""

import threading
import time
from datetime import timedelta

import pytest

from digest_pipeline.domain.errors import UnknownWorkItem
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import CleanupMode
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.retry import RetryPolicy
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.runtime.executor import executor_for
from digest_pipeline.services.cleanup import clean_period
from digest_pipeline.services.deliver import deliver_due
from digest_pipeline_tests.builders import (
    ROWS_PER_CUSTOMER,
    failed_invariants,
    frozen_ledger,
    key_of,
    make_deliverer,
    rows_of,
    state_of,
)
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.fakes import FakeLedger, FakeMailer, FixedClock

#: customer number -> the state `mixed_period` leaves it in
MIXED = {
    1: DeliveryState.SENT,
    2: DeliveryState.SENT,
    3: DeliveryState.FAILED,
    4: DeliveryState.UNKNOWN,
    5: DeliveryState.DEAD_LETTERED,
    6: DeliveryState.RETRY_SCHEDULED,
    7: DeliveryState.PENDING,
}


def mixed_period(clock: FixedClock) -> FakeLedger:
    """Seven customers, one per row of MIXED (a one-attempt budget makes 5 dead-lettered)."""
    ledger, mailer = frozen_ledger(7), FakeMailer(clock=clock)
    mailer.script(key_of(3), SendOutcome.failed(FailureClass.PERMANENT, "smtp:550"))
    mailer.script_timeout_after_accept(key_of(4))
    mailer.script(key_of(5), SendOutcome.failed(FailureClass.TRANSIENT, "smtp:421"))
    mailer.script(
        key_of(6),
        SendOutcome.failed(FailureClass.THROTTLED, "http:429", retry_after=timedelta(hours=1)),
    )
    policy = DeliveryPolicy(retry=RetryPolicy(max_attempts=1))
    deliverer = make_deliverer(ledger, mailer, clock, policy=policy)
    deliver_due(deliverer, batch_size=10, concurrency=1, max_items=6)
    assert {n: state_of(ledger, key_of(n)) for n in MIXED} == MIXED
    return ledger


@pytest.mark.parametrize("mode", list(CleanupMode))
def test_only_sent_items_are_cleaned(clock, mode):
    ledger = mixed_period(clock)

    report = clean_period(ledger, clock, W42, mode)

    assert (report.cleaned, report.rows) == (2, 2 * ROWS_PER_CUSTOMER)
    assert {n: state_of(ledger, key_of(n)) for n in MIXED} == MIXED | {
        1: DeliveryState.CLEANED,
        2: DeliveryState.CLEANED,
    }


@pytest.mark.parametrize("mode", list(CleanupMode))
def test_items_that_were_not_sent_keep_their_rows(clock, mode):
    ledger = mixed_period(clock)

    clean_period(ledger, clock, W42, mode)

    kept = {n: len(rows_of(ledger, key_of(n))) for n in MIXED}
    assert kept == {1: 0, 2: 0, 3: 2, 4: 2, 5: 2, 6: 2, 7: 2}


def test_gate_reports_why_each_other_item_was_held_back(clock):
    ledger = mixed_period(clock)

    report = clean_period(ledger, clock, W42, CleanupMode.ARCHIVE)

    assert report.held_back == {
        "not_sent:failed": 1,
        "not_sent:unknown": 1,
        "not_sent:dead_lettered": 1,
        "not_sent:retry_scheduled": 1,
        "not_sent:pending": 1,
    }


def test_archive_mode_moves_the_rows_to_the_archive(clock):
    ledger = mixed_period(clock)
    rows = rows_of(ledger, key_of(1)) + rows_of(ledger, key_of(2))

    clean_period(ledger, clock, W42, CleanupMode.ARCHIVE)

    archived = [a.row for a in ledger.archived_rows]
    assert sorted(archived, key=lambda r: (str(r.key), r.position)) == rows
    assert {a.archived_at for a in ledger.archived_rows} == {clock.now()}


def test_delete_mode_removes_the_rows_without_archiving(clock):
    ledger = mixed_period(clock)

    clean_period(ledger, clock, W42, CleanupMode.DELETE)

    assert ledger.archived_rows == []
    assert rows_of(ledger, key_of(1)) == []


@pytest.mark.parametrize("mode", list(CleanupMode))
def test_each_cleaned_key_has_one_cleanup_record_with_its_mode_and_row_count(clock, mode):
    ledger = mixed_period(clock)

    clean_period(ledger, clock, W42, mode)

    assert sorted((str(c.key), c.mode, c.rows) for c in ledger.cleanups) == [
        (str(key_of(1)), mode, ROWS_PER_CUSTOMER),
        (str(key_of(2)), mode, ROWS_PER_CUSTOMER),
    ]


def test_cleaned_item_records_when_it_was_cleaned(clock):
    ledger = mixed_period(clock)
    clock.advance(timedelta(minutes=30))

    clean_period(ledger, clock, W42, CleanupMode.ARCHIVE)

    item = ledger.get(key_of(1))
    assert item is not None
    assert item.cleaned_at == clock.now()


def test_running_cleanup_twice_cleans_nothing_the_second_time(clock):
    ledger = mixed_period(clock)
    clean_period(ledger, clock, W42, CleanupMode.ARCHIVE)
    before = (ledger.items(W42), ledger.archived_rows)
    clock.advance(timedelta(hours=1))

    report = clean_period(ledger, clock, W42, CleanupMode.ARCHIVE)

    assert (report.cleaned, report.already_cleaned, report.rows) == (0, 2, 0)
    assert (ledger.items(W42), ledger.archived_rows) == before
    assert sorted(str(c.key) for c in ledger.cleanups) == [str(key_of(1)), str(key_of(2))]
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_cleanup_in_another_mode_later_does_not_clean_again(clock):
    ledger = mixed_period(clock)
    clean_period(ledger, clock, W42, CleanupMode.ARCHIVE)

    report = clean_period(ledger, clock, W42, CleanupMode.DELETE)

    assert report.cleaned == 0
    assert [c.mode for c in ledger.cleanups] == [CleanupMode.ARCHIVE, CleanupMode.ARCHIVE]


def test_cleanup_of_an_untouched_period_does_nothing(clock):
    ledger = frozen_ledger(3)

    report = clean_period(ledger, clock, W42, CleanupMode.ARCHIVE)

    assert (report.cleaned, report.held_back) == (0, {"not_sent:pending": 3})
    assert ledger.cleanups == []


class PagesInFlight(FakeLedger):
    """Counts the cleanup transactions running at once; the page starting at `fail_at` fails."""

    def __init__(self, fail_at: str | None = None) -> None:
        super().__init__()
        self.fail_at = fail_at
        self.count_lock = threading.Lock()
        self.running = self.most = 0
        self.ended: list[str] = []

    def clean_many(self, items, mode, now):
        with self.count_lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            time.sleep(0.01)  # long enough for the next page to be read and submitted
            first = str(items[0][0])
            if first == self.fail_at:
                raise UnknownWorkItem(f"no work item for {first}")
            return super().clean_many(items, mode, now)
        finally:
            with self.count_lock:
                self.running -= 1
                self.ended.append(str(items[0][0]))


def _sent_period(clock: FixedClock, customers: int, ledger: PagesInFlight) -> PagesInFlight:
    frozen_ledger(customers, ledger=ledger)
    deliver_due(
        make_deliverer(ledger, FakeMailer(clock=clock), clock), batch_size=customers, concurrency=16
    )
    return ledger


@pytest.mark.parametrize("in_flight", [1, 2, 3])
def test_pages_in_flight_clean_every_sent_item_once_and_never_exceed_the_bound(clock, in_flight):
    ledger = _sent_period(clock, 230, PagesInFlight())

    report = clean_period(
        ledger,
        clock,
        W42,
        CleanupMode.ARCHIVE,
        page=20,
        in_flight=in_flight,
        executor=executor_for(ledger),
    )

    assert report.cleaned == 230
    assert report.rows == 230 * ROWS_PER_CUSTOMER
    assert {state_of(ledger, key_of(n)) for n in range(1, 231)} == {DeliveryState.CLEANED}
    with ledger.count_lock:
        assert 1 <= ledger.most <= in_flight
    assert failed_invariants(ledger, W42, clock.now()) == []


def test_a_failed_page_stops_cleanup_only_after_every_page_in_flight_has_ended(clock):
    ledger = PagesInFlight()
    keys = sorted(str(key_of(n)) for n in range(1, 101))
    ledger.fail_at = keys[20]
    _sent_period(clock, 100, ledger)

    with pytest.raises(UnknownWorkItem):
        clean_period(
            ledger,
            clock,
            W42,
            CleanupMode.ARCHIVE,
            page=20,
            in_flight=2,
            executor=executor_for(ledger),
        )

    # the page after the failed one was in flight: it ended before clean_period returned
    with ledger.count_lock:
        assert ledger.running == 0
        assert keys[40] in ledger.ended
    cleaned = {str(i.key) for i in ledger.items(W42) if i.state is DeliveryState.CLEANED}
    assert cleaned.isdisjoint(keys[20:40])
    assert failed_invariants(ledger, W42, clock.now()) == []
