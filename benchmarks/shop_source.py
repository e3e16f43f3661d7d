"""A shop source in another SQLite database than the ledger, against the demo tables: time and memory.

The demo shop of N customers is seeded into a ledger (the default source reads it there) and
copied into a second SQLite file under a shop's own schema: `users(id, mail, marketing_consent,
deleted_at)` keyed by integer, `catalog_items` and `purchases`, mapped by a `DIGEST_SOURCE_CONFIG`
that reads customers through a query (`deleted_at IS NULL AS active`) and the rest through
tables. Each source then runs in a fresh process on its own copy of the ledger: the source built
through `wiring.build_customer_source` (the mapped one's checks are `build_s`), the period's
snapshot and its content through the services; peak RSS is that process's own. Both must freeze
the same number of customers and write the same number of rows (`same`).

    .venv/bin/python -m benchmarks.shop_source --customers 100000
"""

import argparse
import shutil
import sqlite3
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import common, tables
from digest_pipeline.adapters.clock import SystemClock
from digest_pipeline.adapters.sql.engine import create_ledger_engine
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.domain.periods import Period
from digest_pipeline.runtime.executor import executor_for
from digest_pipeline.services.content import generate_content
from digest_pipeline.services.snapshot import take_snapshot
from digest_pipeline.settings import load_settings
from digest_pipeline.wiring import build_customer_source

MODULE = "benchmarks.shop_source"
CUSTOMERS = 100_000
SOURCES = ("default", "mapped")
COLUMNS = (
    "source",
    "customers",
    "eligible",
    "build_s",
    "snapshot_s",
    "content_s",
    "total_s",
    "rows",
    "rss_mb",
    "rss_vs_default",
    "same",
)
#: the shop's mapping: customers by a query (its expression), the others by table and columns
CONFIG = """\
customers:
  query: >
    SELECT id AS customer_id, mail AS email, marketing_consent AS opted_in,
    deleted_at IS NULL AS active FROM users
products:
  table: catalog_items
  columns: {product_id: sku, category: department, price_cents: price_minor, url: link,
            image_url: image, created_at: listed_at}
orders:
  table: purchases
  columns: {order_id: id, customer_id: user_id, product_id: sku, ordered_at: purchased_at}
"""
#: the demo tables under the shop's names, customers numbered in id order
COPY = """
ATTACH DATABASE ? AS demo;
CREATE TEMP TABLE numbered AS
    SELECT customer_id, ROW_NUMBER() OVER (ORDER BY customer_id) AS id FROM demo.customers;
CREATE TABLE users (id INTEGER PRIMARY KEY, mail TEXT NOT NULL,
                    marketing_consent BOOLEAN NOT NULL, deleted_at TEXT);
INSERT INTO users SELECT n.id, c.email, c.opted_in, CASE WHEN c.active THEN NULL ELSE c.created_at END
    FROM demo.customers AS c JOIN numbered AS n USING (customer_id);
CREATE TABLE catalog_items (sku TEXT PRIMARY KEY, title TEXT NOT NULL, department TEXT NOT NULL,
                            price_minor INTEGER NOT NULL, currency TEXT NOT NULL,
                            link TEXT NOT NULL, image TEXT, listed_at TEXT NOT NULL);
INSERT INTO catalog_items SELECT product_id, title, category, price_cents, currency, url,
                                 image_url, created_at FROM demo.products;
CREATE TABLE purchases (id TEXT PRIMARY KEY, user_id INTEGER NOT NULL, sku TEXT NOT NULL,
                        purchased_at TEXT NOT NULL);
INSERT INTO purchases SELECT o.order_id, n.id, o.product_id, o.ordered_at
    FROM demo.orders AS o JOIN numbered AS n USING (customer_id);
CREATE INDEX ix_purchases_user ON purchases (user_id);
CREATE INDEX ix_purchases_at ON purchases (purchased_at);
ANALYZE;
"""


@dataclass(frozen=True)
class Options:
    customers: int = CUSTOMERS
    json_dir: Path = field(default=common.DEFAULT_JSON_DIR)


def copy_shop(demo: Path, shop: Path) -> None:
    """The shop's own database: the demo ledger's source tables under the shop's names."""
    db = sqlite3.connect(shop)
    try:
        first, rest = COPY.strip().split(";", 1)
        db.execute(first, (str(demo),))
        db.executescript(rest)
        db.commit()
    finally:
        db.close()


def measure(spec: Mapping[str, Any]) -> dict[str, Any]:
    """In the child: build the source, freeze the period, generate its content; time each."""
    period = Period.parse(spec["period"])
    env = {k: v for k, v in spec["env"].items() if v is not None}
    engine = create_ledger_engine(spec["ledger_url"])
    try:
        ledger, clock = SqlLedger(engine), SystemClock()
        run = executor_for(ledger)
        spans: dict[str, float] = {}
        t0 = time.perf_counter()
        source = build_customer_source(load_settings(env, Path(spec["root"])), engine)
        spans["build_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        snap = take_snapshot(source, ledger, clock, period, "bench", executor=run)
        spans["snapshot_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        content = generate_content(source, ledger, period, executor=run)
        spans["content_s"] = time.perf_counter() - t0
    finally:
        engine.dispose()
    return {
        **{k: round(v, 3) for k, v in spans.items()},
        "total_s": round(sum(spans.values()), 2),
        "eligible": snap.eligible,
        "rows": content.rows,
        **common.peak_rss_mb(),
    }


def run(opts: Options) -> dict[str, Any]:
    now = common.bench_now()
    period = common.latest_period(now)
    rows: list[dict[str, Any]] = []
    with common.workdir("shop-source") as work:
        demo, shop = work / "demo.db", work / "shop.db"
        seeded = common.seed(f"sqlite:///{demo}", opts.customers, now)
        copy_shop(demo, shop)
        (work / "shop.yaml").write_text(CONFIG, encoding="utf-8")
        mapped = {
            "DIGEST_SOURCE_DATABASE_URL": f"sqlite:///{shop}",
            "DIGEST_SOURCE_CONFIG": str(work / "shop.yaml"),
        }
        for name in SOURCES:
            ledger = work / f"ledger-{name}.db"
            shutil.copy(demo, ledger)
            spec = {
                "ledger_url": f"sqlite:///{ledger}",
                "period": str(period),
                "root": str(work),
                "env": common.hermetic(mapped if name == "mapped" else {}),
            }
            out = common.run_child(MODULE, spec, work)
            common.progress(f"{MODULE} {name} {opts.customers:,} customers: {out['total_s']} s")
            rows.append({"source": name, "customers": seeded.customers, **out})
            ledger.unlink()
    default = rows[0]
    for row in rows:
        row["rss_vs_default"] = f"{row['rss_mb'] / default['rss_mb']:.2f}x"
        row["same"] = (row["eligible"], row["rows"]) == (default["eligible"], default["rows"])
    tables.print_table(
        f"Snapshot and content of {opts.customers:,} customers: the demo tables in the ledger "
        "(default) against a shop's own schema in another SQLite file (mapped: customers by a "
        "query, products and orders by table and columns). build_s: the source built and "
        "checked; rss_mb: the process's peak; same: equal eligible customers and rows",
        rows,
        COLUMNS,
    )
    return tables.publish("shop_source", rows, opts)


def main(argv: Sequence[str]) -> int:
    if common.child_main(argv, measure):
        return 0
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__)
    p.add_argument("--customers", type=int, default=CUSTOMERS)
    p.add_argument("--json-dir", type=Path, default=common.DEFAULT_JSON_DIR)
    a = p.parse_args(argv)
    run(Options(a.customers, a.json_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
