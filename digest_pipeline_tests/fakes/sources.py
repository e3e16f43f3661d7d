"""The shop's customers, products and orders in memory, as the SQL customer source reads them."""

import threading
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime

from digest_pipeline.domain.catalogue import Order, Product
from digest_pipeline.domain.model import Customer
from digest_pipeline.ports.outside import CustomerSource
from digest_pipeline_tests.fakes.clock import require_utc


class FakeCustomerSource(CustomerSource):
    """The shop's customer, product and order tables, in memory."""

    def __init__(
        self,
        customers: Iterable[Customer] = (),
        products: Iterable[Product] = (),
        orders: Iterable[Order] = (),
    ) -> None:
        self._lock = threading.Lock()
        self._customers: dict[str, Customer] = {}
        for c in customers:
            self._customers[c.customer_id] = c
        self._products = sorted(products, key=lambda p: p.product_id)
        self._orders = sorted(orders, key=lambda o: (o.ordered_at, o.order_id))

    def customers(self) -> Iterator[Customer]:
        with self._lock:
            current = list(self._customers.values())
        yield from current

    def products(self) -> Iterator[Product]:
        yield from self._products

    def orders(self, since: datetime, until: datetime) -> Iterator[Order]:
        require_utc(since, "since")
        require_utc(until, "until")
        yield from (o for o in self._orders if since <= o.ordered_at < until)

    def orders_of(
        self, customer_ids: Sequence[str], since: datetime, until: datetime
    ) -> Iterator[Order]:
        wanted = frozenset(customer_ids)
        yield from (o for o in self.orders(since, until) if o.customer_id in wanted)

    def update(self, customer: Customer) -> None:
        """Replaces the customer with the same id (or adds a new one, e.g. a late sign-up)."""
        with self._lock:
            self._customers[customer.customer_id] = customer
