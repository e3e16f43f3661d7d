"""The shop's customers, catalogue and orders from the ledger database (the embedded shop's source).

Each method streams in a stable order with `yield_per`, so a large table is never loaded whole.
On SQLite it reads through its own plain connections: the snapshot streams customers while the
ledger's `BEGIN IMMEDIATE` write transaction is open, and a read through the ledger's engine
would wait for the very writer it feeds.
"""

from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import datetime

from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.pool import NullPool

from digest_pipeline.adapters.sql.clauses import one_of
from digest_pipeline.adapters.sql.engine import guard_engine_errors
from digest_pipeline.adapters.sql.schema import customers, orders, products
from digest_pipeline.domain.catalogue import Order, Product
from digest_pipeline.domain.chunks import chunked
from digest_pipeline.domain.model import Customer
from digest_pipeline.ports import CustomerSource

STREAM_ROWS = 10_000
#: customer ids per `IN (…)` list: far below every driver's bound-parameter limit
IDS = 500
SQLITE_READ_TIMEOUT_SECONDS = 30


def _reader(engine: Engine) -> Engine:
    """An engine whose reads never take SQLite's write lock (the same engine elsewhere)."""
    database = engine.url.database
    if engine.dialect.name != "sqlite" or not database or database == ":memory:":
        return engine
    # pysqlite issues no BEGIN before a SELECT, so each read is one statement in autocommit
    # mode, which WAL (set by the ledger's engine) runs beside a writer from its own snapshot.
    # NullPool: nothing to dispose, since no connection outlives a read.
    # the ledger's error boundary too: no statement parameters in any error that leaves here
    return guard_engine_errors(
        create_engine(
            engine.url,
            poolclass=NullPool,
            hide_parameters=True,
            connect_args={"check_same_thread": False, "timeout": SQLITE_READ_TIMEOUT_SECONDS},
        )
    )


class SqlCustomerSource(CustomerSource):
    """Streams customers in id order, products in id order and orders oldest first.

    `orders_of` looks orders up by customer, so content generation reads a period's orders per
    chunk of customers in time proportional to that chunk's orders.
    """

    def __init__(self, engine: Engine) -> None:
        # create_engine does no I/O: the first connection is made by the first read
        self._engine = _reader(engine)

    def customers(self) -> Iterator[Customer]:
        c = customers.c
        q = select(c.customer_id, c.email, c.active, c.opted_in).order_by(c.customer_id)
        with self._engine.connect() as conn:
            # unpacked, not read by name: a Row's attribute lookups cost a large share of this
            # stream's time (the snapshot and the invalid-recipient check each read every customer)
            rows = conn.execution_options(yield_per=STREAM_ROWS).execute(q)
            for customer_id, email, active, opted_in in rows:
                yield Customer(customer_id, email, bool(active), bool(opted_in))

    def products(self) -> Iterator[Product]:
        p = products.c
        q = select(products).order_by(p.product_id)
        with self._engine.connect() as conn:
            for r in conn.execution_options(yield_per=STREAM_ROWS).execute(q):
                yield Product(
                    r.product_id,
                    r.title,
                    r.category,
                    r.price_cents,
                    r.currency,
                    r.url,
                    r.image_url,
                    r.created_at,
                )

    def orders(self, since: datetime, until: datetime) -> Iterator[Order]:
        o = orders.c
        q = (
            select(o.order_id, o.customer_id, o.product_id, o.ordered_at)
            .where(o.ordered_at >= since, o.ordered_at < until)
            .order_by(o.ordered_at, o.order_id)
        )
        with self._engine.connect() as conn:
            rows = conn.execution_options(yield_per=STREAM_ROWS).execute(q)
            for order_id, customer_id, product_id, ordered_at in rows:
                yield Order(order_id, customer_id, product_id, ordered_at)

    def popularity(self, since: datetime, until: datetime) -> Counter[str]:
        o = orders.c
        q = (
            select(o.product_id, func.count())
            .where(o.ordered_at >= since, o.ordered_at < until)
            .group_by(o.product_id)
        )
        with self._engine.connect() as conn:
            return Counter({pid: int(n) for pid, n in conn.execute(q)})

    def orders_of(
        self, customer_ids: Sequence[str], since: datetime, until: datetime
    ) -> Iterator[Order]:
        o = orders.c
        pg = self._engine.dialect.name == "postgresql"
        with self._engine.connect() as conn:
            for ids in chunked(sorted(set(customer_ids)), IDS):
                # the IN list is what makes this cheap: it reads the customers' rows off the
                # customer_id index instead of scanning the window for each chunk of customers
                q = select(o.order_id, o.customer_id, o.product_id, o.ordered_at).where(
                    one_of(o.customer_id, ids, pg), o.ordered_at >= since, o.ordered_at < until
                )
                # fetched whole (a chunk of customers' orders, a few thousand rows): a row at a
                # time would be a fetch call each through SQLAlchemy and psycopg
                for order_id, customer_id, product_id, ordered_at in conn.execute(q).all():
                    yield Order(order_id, customer_id, product_id, ordered_at)
