"""Pure helpers of the model: snapshot fingerprint, Message-ID, eligibility, delivery bounds."""

import re
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from digest_pipeline.domain.errors import InvalidPolicy
from digest_pipeline.domain.model import (
    Customer,
    SnapshotEntry,
    is_eligible,
    message_id_for,
    snapshot_fingerprint,
)
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.retry import RetryPolicy

W42 = Period(2026, 42)
KEY = OperationKey(W42, "customer-1842")
ENTRIES = [
    SnapshotEntry("customer-1", "ada@example.com"),
    SnapshotEntry("customer-2", "grace@example.com"),
    SnapshotEntry("customer-3", "edsger@example.com"),
]

# --- snapshot fingerprint -------------------------------------------------------------------


@given(st.permutations(ENTRIES))
def test_fingerprint_is_independent_of_entry_order(entries):
    assert snapshot_fingerprint(entries) == snapshot_fingerprint(ENTRIES)


def test_fingerprint_changes_when_a_recipient_changes():
    changed = [ENTRIES[0], SnapshotEntry("customer-2", "grace@example.org"), ENTRIES[2]]
    assert snapshot_fingerprint(changed) != snapshot_fingerprint(ENTRIES)


def test_fingerprint_changes_when_a_customer_is_added():
    added = [*ENTRIES, SnapshotEntry("customer-4", "barbara@example.com")]
    assert snapshot_fingerprint(added) != snapshot_fingerprint(ENTRIES)


def test_fingerprint_changes_when_a_customer_is_removed():
    assert snapshot_fingerprint(ENTRIES[:2]) != snapshot_fingerprint(ENTRIES)


def test_fingerprint_changes_when_recipients_swap_customers():
    swapped = [
        SnapshotEntry("customer-1", "grace@example.com"),
        SnapshotEntry("customer-2", "ada@example.com"),
        ENTRIES[2],
    ]
    assert snapshot_fingerprint(swapped) != snapshot_fingerprint(ENTRIES)


def test_fingerprint_is_a_sha256_hex_digest():
    assert re.fullmatch(r"[0-9a-f]{64}", snapshot_fingerprint(ENTRIES))


def test_fingerprint_of_an_empty_selection_is_defined():
    assert snapshot_fingerprint([]) == snapshot_fingerprint([])


# --- Message-ID -----------------------------------------------------------------------------


def test_message_id_is_stable_for_a_key():
    assert message_id_for(KEY) == message_id_for(OperationKey.parse(str(KEY)))


def test_message_id_differs_per_customer():
    assert message_id_for(KEY) != message_id_for(OperationKey(W42, "customer-1843"))


def test_message_id_differs_per_period():
    assert message_id_for(KEY) != message_id_for(OperationKey(Period(2026, 43), "customer-1842"))


def test_message_id_is_an_angle_bracketed_address_at_digest_invalid():
    assert re.fullmatch(r"<[0-9a-f]{32}@digest\.invalid>", message_id_for(KEY))


def test_message_id_uses_the_given_domain():
    assert message_id_for(KEY, domain="shop.example").endswith("@shop.example>")


def test_message_id_does_not_reveal_the_customer_id():
    assert "customer-1842" not in message_id_for(KEY)


# --- eligibility ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("active", "opted_in", "eligible"),
    [
        (True, True, True),  # active and opted in: selected
        (True, False, False),  # active but not opted in
        (False, True, False),  # opted in but inactive
        (False, False, False),  # neither
    ],
)
def test_eligibility_requires_active_and_opted_in(active, opted_in, eligible):
    customer = Customer("customer-1842", "ada@example.com", active=active, opted_in=opted_in)
    assert is_eligible(customer) is eligible


# --- delivery policy ------------------------------------------------------------------------


def test_delivery_window_closes_at_period_end_plus_window():
    policy = DeliveryPolicy(delivery_window=timedelta(days=3))
    assert policy.closes_at(W42) == W42.ends_at + timedelta(days=3)


def test_default_delivery_window_closes_when_the_next_periods_digest_is_due():
    assert DeliveryPolicy().closes_at(W42) == datetime(2026, 10, 26, tzinfo=UTC)


def test_delivery_window_close_crosses_the_year_boundary():
    policy = DeliveryPolicy(delivery_window=timedelta(days=1))
    assert policy.closes_at(Period(2026, 53)) == datetime(2027, 1, 5, tzinfo=UTC)


def test_default_delivery_policy_uses_the_default_retry_policy():
    assert DeliveryPolicy().retry == RetryPolicy()


@pytest.mark.parametrize(
    "fields",
    [
        {"lease": timedelta(0)},  # a lease must be positive
        {"lease": timedelta(seconds=-1)},  # a lease must be positive
        {"delivery_window": timedelta(0)},  # a window must be positive
        {"delivery_window": timedelta(days=-1)},  # a window must be positive
        {"unknown_retention": timedelta(0)},  # retention must be positive
        {"unknown_retention": timedelta(days=-1)},  # retention must be positive
    ],
)
def test_out_of_range_delivery_policy_is_rejected(fields):
    with pytest.raises(InvalidPolicy):
        DeliveryPolicy(**fields)
