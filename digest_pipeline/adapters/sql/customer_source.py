"""The shop's customers, catalogue and orders from SQL: the demo tables or a mapped shop database.

Each method streams in a stable order with `yield_per`, so a large table is never loaded whole,
and every filter, ordering and customer lookup runs in the database, whether a record kind is
read from a table or from a query wrapped as a subquery (`SourceColumns`, built and checked by
source_mapping.py). On SQLite it reads through its own plain connections: the snapshot streams
customers while the ledger's `BEGIN IMMEDIATE` write transaction is open, and a read through the
ledger's engine would wait for the very writer it feeds.
"""

from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Engine, Select, create_engine, func, select
from sqlalchemy.pool import NullPool

from digest_pipeline.adapters.sql.clauses import one_of
from digest_pipeline.adapters.sql.engine import guard_engine_errors
from digest_pipeline.adapters.sql.schema import customers, orders, products
from digest_pipeline.domain.catalogue import Order, Product
from digest_pipeline.domain.chunks import chunked
from digest_pipeline.domain.model import Customer
from digest_pipeline.ports import CustomerSource
from digest_pipeline.source_settings import FIELDS

STREAM_ROWS = 10_000
#: customer ids per `IN (…)` list: far below every driver's bound-parameter limit
IDS = 500
SQLITE_READ_TIMEOUT_SECONDS = 30

Columns = Mapping[str, ColumnElement[Any]]


@dataclass(frozen=True)
class SourceColumns:
    """Each record kind's columns by domain field name (`source_settings.FIELDS`).

    A column may belong to a table or to a query's subquery; its type turns what the driver
    hands over into the domain's value.
    """

    customers: Columns
    products: Columns
    orders: Columns
    #: orders' customer id as an order lookup compares it: the column, typed for its ids
    order_customer: ColumnElement[Any]
    #: a customer id in that column's kind (42 for `42` in an integer column), returning None
    #: for an id the column cannot hold; unset: ids are bound as the text they are
    lookup_id: Callable[[str], Any] | None = None


def _own(table: Any, entity: str) -> Columns:
    return {f: table.c[f] for f in FIELDS[entity]}


#: the embedded demo shop: the ledger schema's own tables, typed by it
DEMO_TABLES = SourceColumns(
    _own(customers, "customers"),
    _own(products, "products"),
    _own(orders, "orders"),
    orders.c.customer_id,
)


def reader_engine(engine: Engine) -> Engine:
    """An engine whose reads never take SQLite's write lock (the same engine elsewhere)."""
    database = engine.url.database
    if engine.dialect.name != "sqlite" or not database or database == ":memory:":
        return engine
    if isinstance(engine.pool, NullPool):
        return engine  # already a reader: each read its own connection, nothing to dispose
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


def _pick(columns: Columns, *names: str) -> list[ColumnElement[Any]]:
    return [columns[n] for n in names]


def customers_query(s: SourceColumns) -> Select[Any]:
    """Every customer, in id order."""
    c = s.customers
    return select(*_pick(c, *FIELDS["customers"])).order_by(c["customer_id"])


def products_query(s: SourceColumns) -> Select[Any]:
    """The whole catalogue, in product id order."""
    p = s.products
    return select(*_pick(p, *FIELDS["products"])).order_by(p["product_id"])


def _window(s: SourceColumns, since: datetime, until: datetime) -> list[ColumnElement[bool]]:
    at = s.orders["ordered_at"]
    return [at >= since, at < until]


def orders_query(s: SourceColumns, since: datetime, until: datetime) -> Select[Any]:
    """The window's order lines, oldest first."""
    o = s.orders
    return (
        select(*_pick(o, *FIELDS["orders"]))
        .where(*_window(s, since, until))
        .order_by(o["ordered_at"], o["order_id"])
    )


def popularity_query(s: SourceColumns, since: datetime, until: datetime) -> Select[Any, int]:
    """Order lines per product id in the window, counted in the database."""
    pid = s.orders["product_id"]
    return select(pid, func.count()).where(*_window(s, since, until)).group_by(pid)


def orders_of_query(
    s: SourceColumns, ids: Sequence[Any], since: datetime, until: datetime, pg: bool
) -> Select[Any]:
    """The window's order lines of one chunk of customer ids (in the lookup column's type)."""
    # the IN list is what makes this cheap: it reads the customers' rows off the customer_id
    # index instead of scanning the window for each chunk of customers
    return select(*_pick(s.orders, *FIELDS["orders"])).where(
        one_of(s.order_customer, ids, pg), *_window(s, since, until)
    )


class SqlCustomerSource(CustomerSource):
    """Streams customers in id order, products in id order and orders oldest first.

    `orders_of` looks orders up by customer, so content generation reads a period's orders per
    chunk of customers in time proportional to that chunk's orders. Customer ids are bound as
    the orders' customer id column holds them (`SourceColumns.lookup_id`).
    """

    def __init__(self, engine: Engine, columns: SourceColumns = DEMO_TABLES) -> None:
        # create_engine does no I/O: the first connection is made by the first read
        self._engine = reader_engine(engine)
        self._columns = columns

    @property
    def engine(self) -> Engine:
        """The engine every read goes through."""
        return self._engine

    def customers(self) -> Iterator[Customer]:
        with self._engine.connect() as conn:
            # unpacked, not read by name: a Row's attribute lookups cost a large share of this
            # stream's time (the snapshot and the invalid-recipient check each read every customer)
            rows = conn.execution_options(yield_per=STREAM_ROWS).execute(
                customers_query(self._columns)
            )
            for customer_id, email, active, opted_in in rows:
                yield Customer(customer_id, email, bool(active), bool(opted_in))

    def products(self) -> Iterator[Product]:
        with self._engine.connect() as conn:
            rows = conn.execution_options(yield_per=STREAM_ROWS).execute(
                products_query(self._columns)
            )
            for row in rows:
                yield Product(*row)

    def orders(self, since: datetime, until: datetime) -> Iterator[Order]:
        with self._engine.connect() as conn:
            rows = conn.execution_options(yield_per=STREAM_ROWS).execute(
                orders_query(self._columns, since, until)
            )
            for order_id, customer_id, product_id, ordered_at in rows:
                yield Order(order_id, customer_id, product_id, ordered_at)

    def popularity(self, since: datetime, until: datetime) -> Counter[str]:
        with self._engine.connect() as conn:
            q = popularity_query(self._columns, since, until)
            return Counter({pid: int(n) for pid, n in conn.execute(q)})

    def orders_of(
        self, customer_ids: Sequence[str], since: datetime, until: datetime
    ) -> Iterator[Order]:
        pg = self._engine.dialect.name == "postgresql"
        wanted: list[Any] = sorted(set(customer_ids))
        if (lookup := self._columns.lookup_id) is not None:
            # an id the column cannot hold (`customer-7` in an integer column) matches no order
            wanted = sorted({i for i in map(lookup, wanted) if i is not None})
        with self._engine.connect() as conn:
            for ids in chunked(wanted, IDS):
                q = orders_of_query(self._columns, ids, since, until, pg)
                # fetched whole (a chunk of customers' orders, a few thousand rows): a row at a
                # time would be a fetch call each through SQLAlchemy and psycopg
                for order_id, customer_id, product_id, ordered_at in conn.execute(q).all():
                    yield Order(order_id, customer_id, product_id, ordered_at)
