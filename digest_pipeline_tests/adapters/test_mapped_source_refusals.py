"""A mapping the shop's database cannot serve is one line at build time, and changes nothing.

Each refusal names the variable, the record kind with its table or query, and the column, never
a value (which may be an address). A bad value the build's few sampled rows missed stops the
snapshot as it streams: the freeze is rolled back, so the period has no snapshot afterwards.
"""

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text

from digest_pipeline.adapters.demo_data import seed_demo
from digest_pipeline.adapters.sql.customer_source import SqlCustomerSource
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.services.snapshot import take_snapshot
from digest_pipeline.source_settings import InvalidSource
from digest_pipeline.wiring import build_customer_source
from digest_pipeline_tests.adapters.shop_schema import (
    PG_SCHEMA,
    copy_demo,
    query_config,
    source_settings,
    table_config,
)
from digest_pipeline_tests.cli.conftest import dump
from digest_pipeline_tests.conftest import T0, W42, require_postgres_url
from digest_pipeline_tests.fakes import FixedClock


@pytest.fixture
def ledger(sql_engine_factory: Callable[[str], Engine]) -> Engine:
    engine = sql_engine_factory("sqlite")
    seed_demo(engine, customers=12, seed=7, now=T0)
    return engine


@pytest.fixture
def shop_url(ledger: Engine, tmp_path: Path) -> str:
    path = tmp_path / "shop.db"
    engine = create_engine(f"sqlite:///{path}")
    copy_demo(SqlCustomerSource(ledger), engine, None)
    engine.dispose()
    return f"sqlite:///{path}"


def _swap(config: str, old: str, new: str) -> str:
    assert old in config
    return config.replace(old, new)


TABLES, QUERIES = table_config(None), query_config(None)

#: (config, what the line must name, in order)
REFUSED = {
    "missing table": (
        _swap(TABLES, "table: purchases", "table: purchase"),
        ["orders (table purchase)", "no such table"],
    ),
    "missing column": (
        _swap(TABLES, "email: mail", "email: e_mail"),
        ["customers (table users)", "no column e_mail", "(for email)"],
    ),
    "an expression as a column": (
        _swap(TABLES, "active: is_active", "active: deleted_at IS NULL"),
        ["customers (table users)", "no column deleted_at IS NULL", "belongs in a `query`"],
    ),
    "a query without a field": (
        _swap(QUERIES, "cur AS currency, ", ""),
        ["products (query)", "no column currency", "AS currency"],
    ),
    "an unreadable query": (
        _swap(QUERIES, "FROM catalog_items", "FROM catalogue_items"),
        ["products (query)", "the database refused it", "catalogue_items"],
    ),
    "text where a flag is expected": (
        _swap(TABLES, "opted_in: marketing_consent", "opted_in: mail"),
        ["customers (table users)", "column mail (opted_in)", "holds text", "true/false"],
    ),
    "a number where text is expected": (
        _swap(TABLES, "title: name", "title: price_minor"),
        ["products (table catalog_items)", "column price_minor (title)", "a whole number"],
    ),
    "NULL where a field is required": (
        # most customers are active: their `deleted_at` is NULL
        _swap(TABLES, "email: mail", "email: deleted_at"),
        ["customers (table users)", "column deleted_at (email)", "holds NULL"],
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_mapping_the_database_cannot_serve_is_one_line_naming_kind_and_column(
    ledger, shop_url, tmp_path, case
):
    config, names = REFUSED[case]
    before = dump(ledger)
    settings = source_settings(tmp_path, shop_url, config)

    with pytest.raises(InvalidSource) as refused:
        build_customer_source(settings, ledger)

    line = str(refused.value)
    assert line.startswith("DIGEST_SOURCE_CONFIG=shop.yaml: ")
    assert "\n" not in line
    positions = [line.find(n) for n in names]
    assert -1 not in positions, line
    assert positions == sorted(positions), line
    assert "@" not in line  # no address, even where the column holds them
    assert dump(ledger) == before


def test_a_missing_shop_file_is_named_and_not_created(ledger, tmp_path):
    missing = tmp_path / "elsewhere" / "shop.db"
    settings = source_settings(tmp_path, f"sqlite:///{missing}", TABLES)

    with pytest.raises(
        InvalidSource, match=f"DIGEST_SOURCE_DATABASE_URL: no SQLite file at {missing}"
    ):
        build_customer_source(settings, ledger)

    assert not missing.parent.exists()


def test_a_bad_value_past_the_sampled_rows_stops_the_snapshot_before_anything_is_frozen(
    ledger, shop_url, tmp_path
):
    last = max(c.customer_id for c in SqlCustomerSource(ledger).customers())
    config = _swap(
        QUERIES,
        "mail AS email",
        f"CASE WHEN uid = '{last}' THEN NULL ELSE mail END AS email",
    )
    source = build_customer_source(source_settings(tmp_path, shop_url, config), ledger)
    sql_ledger = SqlLedger(ledger)

    with pytest.raises(InvalidSource, match=r"customers \(query\): column email holds NULL"):
        take_snapshot(source, sql_ledger, FixedClock(T0), W42, "run-1")

    assert sql_ledger.snapshot(W42) is None
    assert dump(ledger)["eligibility_snapshot"] == []


@pytest.fixture
def pg_shop(sql_engine_factory: Callable[[str], Engine]) -> Iterator[Engine]:
    ledger = sql_engine_factory("postgres")
    seed_demo(ledger, customers=5, seed=7, now=T0)
    copy_demo(SqlCustomerSource(ledger), ledger, PG_SCHEMA)
    yield ledger
    with ledger.begin() as conn:
        conn.execute(text(f"DROP SCHEMA {PG_SCHEMA} CASCADE"))


@pytest.mark.integration
def test_postgresql_refuses_a_declared_type_the_field_cannot_hold(pg_shop, tmp_path):
    config = _swap(table_config(PG_SCHEMA), "ordered_at: purchased_at", "ordered_at: sku")
    settings = source_settings(tmp_path, require_postgres_url(), config)

    with pytest.raises(InvalidSource) as refused:
        build_customer_source(settings, pg_shop)

    assert str(refused.value) == (
        "DIGEST_SOURCE_CONFIG=shop.yaml: orders (table shop.purchases): column sku (ordered_at) "
        "is VARCHAR(64) where a date and time is expected"
    )


@pytest.mark.integration
def test_a_postgresql_source_session_cannot_write(pg_shop, tmp_path):
    # a query is SQL as written: the source's own sessions are read-only all the same
    config = _swap(
        query_config(PG_SCHEMA),
        f"FROM {PG_SCHEMA}.users",
        f"FROM {PG_SCHEMA}.users, LATERAL (SELECT nextval('{PG_SCHEMA}.s')) AS n",
    )
    with pg_shop.begin() as conn:
        conn.execute(text(f"CREATE SEQUENCE {PG_SCHEMA}.s"))
    settings = source_settings(tmp_path, require_postgres_url(), config)

    with pytest.raises(InvalidSource, match="read-only transaction"):
        build_customer_source(settings, pg_shop)
