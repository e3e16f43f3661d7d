"""The snapshot's recipient rules: the address length cap, and one digest per id, not per mailbox."""

from digest_pipeline.domain.model import Customer, SnapshotEntry
from digest_pipeline.services.enqueue import enqueue_period
from digest_pipeline.services.snapshot import take_snapshot
from digest_pipeline_tests.builders import customer_id, email_of, make_customer
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.fakes import FakeCustomerSource, FakeLedger

MAX_ADDRESS_LENGTH = 320
#: exactly at the cap, and one past it
AT_CAP = "a" * 64 + "@" + "b" * (MAX_ADDRESS_LENGTH - 65)
OVER_CAP = "a" * 64 + "@" + "b" * (MAX_ADDRESS_LENGTH - 64)
HUGE = "x" * 100_000 + "@example.com"


def test_an_address_over_320_characters_is_left_out_and_counted(clock):
    assert (len(AT_CAP), len(OVER_CAP)) == (320, 321)
    source = FakeCustomerSource(
        [
            make_customer(1, email=AT_CAP),
            make_customer(2, email=OVER_CAP),
            make_customer(3, email=HUGE),
            make_customer(4),
        ]
    )
    ledger = FakeLedger()

    report = take_snapshot(source, ledger, clock, W42, "run-1")

    assert ledger.snapshot_entries(W42) == [
        SnapshotEntry(customer_id(1), AT_CAP),
        SnapshotEntry(customer_id(4), email_of(4)),
    ]
    assert (report.eligible, report.considered) == (2, 4)
    assert report.invalid_ids == 0
    assert report.long_addresses == 2
    # never a work item, so never a message
    enqueue_period(ledger, clock, W42)
    assert {i.customer_id for i in ledger.items(W42)} == {customer_id(1), customer_id(4)}


def test_exclusions_are_recounted_from_the_source_naming_only_valid_ids():
    from digest_pipeline.services.snapshot import count_exclusions  # new with the check

    source = FakeCustomerSource(
        [
            Customer("bad id\x1b[2J", "x@example.com", True, True),
            Customer("also/bad", "y@example.com", True, True),
            make_customer(2, email=OVER_CAP),
            make_customer(3, email=HUGE, active=False),  # not eligible: not counted
            make_customer(4),
        ]
    )

    found = count_exclusions(source)

    assert (found.invalid_ids, found.long_addresses, found.total) == (2, 1, 3)
    assert found.long_address_ids == (customer_id(2),)


def test_three_ids_sharing_one_mailbox_get_one_digest_each(clock):
    # docs/explanation/decisions.md, "One digest per customer id": selection is by customer id.
    # Each id has its own orders, content, unsubscribe link and operation key, so none is dropped for another.
    shared = ["Pat@Example.com", "pat@example.com", " pat@EXAMPLE.com"]
    source = FakeCustomerSource([make_customer(n, email=e) for n, e in enumerate(shared, 1)])
    ledger = FakeLedger()

    report = take_snapshot(source, ledger, clock, W42, "run-1")
    enqueue_period(ledger, clock, W42)

    assert report.eligible == 3
    assert [e.recipient for e in ledger.snapshot_entries(W42)] == shared
    assert len(ledger.items(W42)) == 3
