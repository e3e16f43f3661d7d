"""A shop's own schema for the mapped-source tests: the demo shop's records under other names.

`users`, `catalog_items` and `purchases` hold exactly what the demo tables hold (copied through
the demo source), so a mapped source over them must read back exactly the demo's records. The
`members` / `member_orders` pair keys customers by integer, as many shops do.
"""

from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import (
    Boolean,
    Column,
    DateTime,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    insert,
    text,
)

from digest_pipeline.adapters.sql.customer_source import SqlCustomerSource
from digest_pipeline.domain.catalogue import Order, Product
from digest_pipeline.domain.model import Customer
from digest_pipeline.settings import Settings, load_settings

#: every order the demo holds: its 12 weeks before T0, with room either side
ALL_TIME = (datetime(2000, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC))
#: the PostgreSQL schema the shop's tables live in, beside the ledger's `public`
PG_SCHEMA = "shop"


def shop_tables(schema: str | None) -> MetaData:
    """The shop's tables; times are `timestamp` without a zone, holding UTC (as many shops do)."""
    md = MetaData(schema=schema)
    Table(
        "users",
        md,
        Column("uid", String(128), primary_key=True),
        Column("mail", String(320), nullable=False),
        Column("marketing_consent", Boolean, nullable=False),
        Column("is_active", Boolean, nullable=False),
        Column("deleted_at", DateTime),
    )
    Table(
        "catalog_items",
        md,
        Column("sku", String(64), primary_key=True),
        Column("name", String(300), nullable=False),
        Column("department", String(64), nullable=False),
        Column("price_minor", Integer, nullable=False),
        Column("cur", String(3), nullable=False),
        Column("link", String(500), nullable=False),
        Column("picture", String(500)),
        Column("listed_at", DateTime, nullable=False),
    )
    Table(
        "purchases",
        md,
        Column("line", String(64), primary_key=True),
        Column("buyer", String(128), nullable=False, index=True),
        Column("sku", String(64), nullable=False),
        Column("purchased_at", DateTime, nullable=False, index=True),
    )
    Table(
        "members",
        md,
        Column("id", Integer, primary_key=True, autoincrement=False),
        Column("mail", String(320), nullable=False),
        Column("consent", Boolean, nullable=False),
        Column("active", Boolean, nullable=False),
    )
    Table(
        "member_orders",
        md,
        Column("line", String(64), primary_key=True),
        Column("member", Integer, nullable=False, index=True),
        Column("sku", String(64), nullable=False),
        Column("at", DateTime, nullable=False),
    )
    return md


def naive(t: datetime) -> datetime:
    return t.astimezone(UTC).replace(tzinfo=None)


def copy_demo(demo: SqlCustomerSource, engine: Engine, schema: str | None) -> MetaData:
    """Creates the shop's tables on `engine` and fills them with the demo source's records."""
    md = shop_tables(schema)
    with engine.begin() as conn:
        if schema is not None:
            conn.execute(text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
            conn.execute(text(f"CREATE SCHEMA {schema}"))
        md.create_all(conn)
        people = list(demo.customers())
        lines = list(demo.orders(*ALL_TIME))
        t = md.tables
        conn.execute(insert(t[f"{_q(schema)}users"]), [_user(c) for c in people])
        conn.execute(insert(t[f"{_q(schema)}catalog_items"]), [_item(p) for p in demo.products()])
        conn.execute(insert(t[f"{_q(schema)}purchases"]), [_purchase(o) for o in lines])
        numbers = {c.customer_id: n for n, c in enumerate(people, start=1)}
        conn.execute(
            insert(t[f"{_q(schema)}members"]),
            [
                {"id": numbers[c.customer_id], "mail": c.email, "consent": c.opted_in}
                | {"active": c.active}
                for c in people
            ],
        )
        conn.execute(
            insert(t[f"{_q(schema)}member_orders"]),
            [
                {"line": o.order_id, "member": numbers[o.customer_id], "sku": o.product_id}
                | {"at": naive(o.ordered_at)}
                for o in lines
            ],
        )
    return md


def _q(schema: str | None) -> str:
    return f"{schema}." if schema else ""


def _user(c: Customer) -> dict[str, object]:
    gone = None if c.active else naive(datetime(2026, 1, 1, tzinfo=UTC))
    return {
        "uid": c.customer_id,
        "mail": c.email,
        "marketing_consent": c.opted_in,
        "is_active": c.active,
        "deleted_at": gone,
    }


def _item(p: Product) -> dict[str, object]:
    return {
        "sku": p.product_id,
        "name": p.title,
        "department": p.category,
        "price_minor": p.price_cents,
        "cur": p.currency,
        "link": p.url,
        "picture": p.image_url,
        "listed_at": naive(p.created_at),
    }


def _purchase(o: Order) -> dict[str, object]:
    return {
        "line": o.order_id,
        "buyer": o.customer_id,
        "sku": o.product_id,
        "purchased_at": naive(o.ordered_at),
    }


def table_config(schema: str | None) -> str:
    """Every record kind as a table with a column mapping (customers' own `is_active`)."""
    where = f"\n  schema: {schema}" if schema else ""
    return f"""
customers:
  table: users{where}
  columns: {{customer_id: uid, email: mail, opted_in: marketing_consent, active: is_active}}
products:
  table: catalog_items{where}
  columns:
    product_id: sku
    title: name
    category: department
    price_cents: price_minor
    currency: cur
    url: link
    image_url: picture
    created_at: listed_at
orders:
  table: purchases{where}
  columns: {{order_id: line, customer_id: buyer, product_id: sku, ordered_at: purchased_at}}
"""


def query_config(schema: str | None) -> str:
    """Every record kind as a query; a customer is active while `deleted_at` is unset."""
    s = _q(schema)
    return f"""
customers:
  query: |
    SELECT uid AS customer_id, mail AS email, marketing_consent AS opted_in,
           deleted_at IS NULL AS active
    FROM {s}users
products:
  query: >
    SELECT sku AS product_id, name AS title, department AS category,
    price_minor AS price_cents, cur AS currency, link AS url, picture AS image_url,
    listed_at AS created_at FROM {s}catalog_items
orders:
  query: >-
    SELECT line AS order_id, buyer AS customer_id, sku AS product_id,
    purchased_at AS ordered_at FROM {s}purchases;
"""


def members_config(schema: str | None) -> str:
    """Customers keyed by integer (`members`), their orders by that integer (`member_orders`)."""
    where = f"\n  schema: {schema}" if schema else ""
    return f"""
customers:
  table: members{where}
  columns: {{customer_id: id, email: mail, opted_in: consent, active: active}}
products:
  table: catalog_items{where}
  columns: {{product_id: sku, title: name, category: department, price_cents: price_minor,
             currency: cur, url: link, image_url: picture, created_at: listed_at}}
orders:
  table: member_orders{where}
  columns: {{order_id: line, customer_id: member, product_id: sku, ordered_at: at}}
"""


def source_settings(folder: Path, url: str, config: str) -> Settings:
    """The settings of a shop source at `url` mapped by `config` (written into `folder`)."""
    path = folder / "shop.yaml"
    path.write_text(config, encoding="utf-8")
    return load_settings(
        {"DIGEST_SOURCE_DATABASE_URL": url, "DIGEST_SOURCE_CONFIG": "shop.yaml"}, folder
    )
