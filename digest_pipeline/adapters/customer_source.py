"""Customers from the `customers` table of the ledger database (the embedded shop's source)."""

from collections.abc import Iterator

from sqlalchemy import Engine, select

from digest_pipeline.adapters.sql_schema import customers
from digest_pipeline.domain.model import Customer
from digest_pipeline.ports import CustomerSource

STREAM_ROWS = 10_000


class SqlCustomerSource(CustomerSource):
    """Streams customers in id order without loading the whole table."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def customers(self) -> Iterator[Customer]:
        c = customers.c
        q = select(c.customer_id, c.email, c.active, c.opted_in).order_by(c.customer_id)
        with self._engine.connect() as conn:
            for r in conn.execution_options(yield_per=STREAM_ROWS).execute(q):
                yield Customer(r.customer_id, r.email, bool(r.active), bool(r.opted_in))
