"""The fixed week rigs and tests seed, and one frozen, enqueued period of numbered customers.

Every value is recognisable in a failure message (`customer-0007`, its address, its row titles).
The tests' builders re-export these, so a test and a rig seed the same customers the same way.
"""

from datetime import UTC, datetime

from digest_pipeline.domain.model import DigestRow, SnapshotEntry
from digest_pipeline.domain.periods import DEFAULT_INSTANCE, OperationKey, Period
from digest_pipeline.ports import Ledger

#: Monday 06:00 UTC after 2026-W42: when the weekly schedule delivers that week.
T0 = datetime(2026, 10, 19, 6, 0, tzinfo=UTC)
W42 = Period(2026, 42)
#: generated rows per customer made by `seed_period`
ROWS_PER_CUSTOMER = 2
#: a real shop's one-click link (the path `digest serve` answers) and postal address: a ledger
#: without `digest seed` demo data refuses to deliver or serve without both (domain/compliance.py)
SHOP_UNSUBSCRIBE_URL = "https://shop.example/unsubscribe/{customer_id}?token={token}"
SHOP_POSTAL_ADDRESS = "Example Shop Ltd, 1 Market Street, Springfield 12345"
#: the two as the environment a rig's or test's `digest` (or Dagster run) reads them from
SHOP_LINK_SETTINGS = {
    "DIGEST_UNSUBSCRIBE_URL": SHOP_UNSUBSCRIBE_URL,
    "DIGEST_POSTAL_ADDRESS": SHOP_POSTAL_ADDRESS,
}


def customer_id(n: int) -> str:
    """`customer-0007`: the id of customer number `n`."""
    return f"customer-{n:04d}"


def email_of(n: int) -> str:
    """The address of customer number `n`, on a domain that reaches no real mailbox."""
    return f"shopper.{n:04d}@mailbox.example"


def row_title(n: int, position: int) -> str:
    """A digest row title unlikely to appear anywhere by accident."""
    return f"Walnut Serving Board #{n:04d}/{position}"


def key_of(n: int, period: Period = W42, instance: str = DEFAULT_INSTANCE) -> OperationKey:
    """The operation key of customer number `n` in `period` of digest instance `instance`."""
    return OperationKey(period, customer_id(n), instance)


def digest_rows_for(key: OperationKey, n: int, count: int = ROWS_PER_CUSTOMER) -> list[DigestRow]:
    """`count` generated rows (title, price, url) of customer number `n` for `key`."""
    return [
        DigestRow(
            key,
            position,
            {
                "title": row_title(n, position),
                "price": "12.50",
                "url": f"https://shop.example/p/{n:04d}-{position}",
            },
        )
        for position in range(count)
    ]


def seed_period(
    ledger: Ledger,
    count: int,
    *,
    period: Period = W42,
    now: datetime = T0,
    rows_per_customer: int = ROWS_PER_CUSTOMER,
    enqueue: bool = True,
) -> list[OperationKey]:
    """Freezes customers 1..count for `period` and stores their rows, all at `now`.

    By default it also enqueues one pending item each. Returns their operation keys.
    """
    numbers = range(1, count + 1)
    ledger.freeze_snapshot(
        period, "run-snapshot", now, [SnapshotEntry(customer_id(n), email_of(n)) for n in numbers]
    )
    keys = [key_of(n, period, ledger.instance) for n in numbers]
    ledger.add_digest_rows(
        row
        for n, key in zip(numbers, keys, strict=True)
        for row in digest_rows_for(key, n, rows_per_customer)
    )
    if enqueue:
        ledger.enqueue(period, now)
    return keys
