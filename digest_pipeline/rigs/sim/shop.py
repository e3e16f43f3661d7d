"""The simulated shop: N opted-in customers, their generated rows and a plain-text composer.

Addresses use the reserved `.invalid` domain; nothing here can reach a real mailbox, and the
composer is deliberately cheap, since rendering is not what the simulator measures.
"""

from collections.abc import Iterator, Sequence
from datetime import datetime

from digest_pipeline.domain.catalogue import Order, Product
from digest_pipeline.domain.model import Customer, DigestRow, Message, WorkItem, message_id_for
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.ports import Composer, CustomerSource

#: generated rows per customer; cleanup archives them
ROWS_PER_CUSTOMER = 2
SENDER = "digest@sim.invalid"


def customer_id(n: int) -> str:
    """`customer-0000042`: zero-padded, so key order is number order."""
    return f"customer-{n:07d}"


class SimCustomers(CustomerSource):
    """`count` active, opted-in customers; no catalogue or orders (rows are made directly)."""

    def __init__(self, count: int) -> None:
        self._count = count

    def customers(self) -> Iterator[Customer]:
        for n in range(1, self._count + 1):
            yield Customer(customer_id(n), f"{customer_id(n)}@sim.invalid", True, True)

    def products(self) -> Iterator[Product]:
        return iter(())

    def orders(self, since: datetime, until: datetime) -> Iterator[Order]:
        return iter(())


def digest_rows(period: Period, count: int) -> Iterator[DigestRow]:
    """The generated content rows of every customer, `ROWS_PER_CUSTOMER` each."""
    for n in range(1, count + 1):
        key = OperationKey(period, customer_id(n))
        for position in range(ROWS_PER_CUSTOMER):
            yield DigestRow(key, position, {"title": f"pick {position}", "price_cents": 1250})


class SimComposer(Composer):
    """A short text message carrying the headers a receiver deduplicates on."""

    def compose(self, item: WorkItem, recipient: str, rows: Sequence[DigestRow]) -> Message:
        key = item.key
        lines = [f"- {r.payload.get('title', '')}" for r in rows]
        return Message(
            key=key,
            recipient=recipient,
            sender=SENDER,
            subject=f"Your digest for {key.period}",
            text="\n".join([f"Your digest for {key.period}", *lines]),
            headers=(("Message-ID", message_id_for(key)), ("X-Digest-Operation-Key", str(key))),
        )
