"""`DIGEST_SOURCE_*` are read without a database: defaults, the mapping file's format, refusals.

Unset, the source is the demo tables in the ledger's database, as before. A mapping file maps
each record kind to a table (unlisted fields read the column of their own name) or a query; any
other shape is one line naming the variable and the key at fault. A URL is refused as the
ledger's is, without repeating it. Values are read into the domain's types (source_types.py),
and a wrong one is refused by its kind, never its value.
"""

from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from uuid import UUID

import pytest
from sqlalchemy import BigInteger, String, Uuid, create_engine
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Dialect

from digest_pipeline.adapters.sql.source_types import (
    SourceValue,
    lookup_kind,
    sqlite_instant_text,
    uuid_id,
    whole_id,
)
from digest_pipeline.settings import DATABASE_SCHEMES, load_settings
from digest_pipeline.source_settings import (
    FIELDS,
    EntitySource,
    InvalidSource,
    SourceSettings,
    read_source,
    require_demo_source,
)

ROOT = Path("/srv/shop")


def read(tmp_path: Path, config: str, **env: str) -> SourceSettings:
    (tmp_path / "shop.yaml").write_text(config, encoding="utf-8")
    return read_source({"DIGEST_SOURCE_CONFIG": "shop.yaml", **env}, tmp_path)


def test_unset_is_the_demo_tables_in_the_ledgers_database():
    source = load_settings({}, ROOT).source

    assert source.is_default
    assert source.database_url is None
    assert [source.entity(e) for e in FIELDS] == [
        EntitySource(e, table=e, columns=tuple((f, f) for f in FIELDS[e])) for e in FIELDS
    ]


@pytest.mark.parametrize("scheme", DATABASE_SCHEMES)
def test_the_source_accepts_the_ledgers_database_schemes(tmp_path, scheme):
    url = f"{scheme}:///{tmp_path / 'shop.db'}" if "sqlite" in scheme else f"{scheme}://u@h/shop"

    assert read_source({"DIGEST_SOURCE_DATABASE_URL": url}, tmp_path).database_url == url


def test_a_table_maps_the_listed_fields_and_reads_the_rest_by_their_own_names(tmp_path):
    source = read(
        tmp_path,
        "products:\n  table: catalog_items\n  schema: shop\n"
        "  columns: {product_id: sku, title: name, image_url: null}\n",
    )

    assert not source.is_default
    products = source.entity("products")
    assert (products.table, products.schema, products.query) == ("catalog_items", "shop", None)
    assert dict(products.columns) == {
        "product_id": "sku",
        "title": "name",
        "category": "category",
        "price_cents": "price_cents",
        "currency": "currency",
        "url": "url",
        "image_url": None,
        "created_at": "created_at",
    }
    assert products.origin == "products (table shop.catalog_items)"
    # a kind the file leaves out is read from its demo table
    assert source.entity("orders") == EntitySource(
        "orders", table="orders", columns=tuple((f, f) for f in FIELDS["orders"])
    )


def test_an_asset_key_is_kept_beside_either_form_as_its_path(tmp_path):
    (tmp_path / "shop.yaml").write_text(
        "customers: {table: users, asset: shop/users}\norders: {query: SELECT 1, asset: buys}\n",
        encoding="utf-8",
    )

    source = read_source({"DIGEST_SOURCE_CONFIG": "shop.yaml"}, tmp_path)

    assert source.entity("customers").asset == ("shop", "users")
    assert source.entity("orders").asset == ("buys",)
    assert source.entity("products").asset is None


def test_a_query_is_kept_as_written_without_its_closing_semicolon(tmp_path):
    source = read(tmp_path, "customers:\n  query: |\n    SELECT a AS b\n    FROM users;\n")

    assert source.entity("customers").query == "SELECT a AS b\nFROM users"
    assert source.entity("customers").origin == "customers (query)"


def test_a_relative_file_is_found_from_the_project_folder_and_named_as_given(tmp_path):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "shop.yaml").write_text("orders: {table: purchases}\n", encoding="utf-8")

    source = read_source({"DIGEST_SOURCE_CONFIG": "conf/shop.yaml"}, tmp_path)

    assert source.config == Path("conf/shop.yaml")
    assert source.entity("orders").table == "purchases"


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ("customers: [", "DIGEST_SOURCE_CONFIG=shop.yaml: not YAML (line 1)"),
        ("- customers", "DIGEST_SOURCE_CONFIG=shop.yaml: must map customers, products"),
        ("shoppers: {table: users}", "unknown key 'shoppers'; use customers, products"),
        ("customers: users", "customers: must hold `table` (with optional `columns`) or `query`"),
        ("customers: {table: users, query: SELECT 1}", "customers: use either `table`"),
        ("customers: {columns: {email: mail}}", "customers: use either `table`"),
        ("customers: {query: SELECT 1, schema: s}", "customers: use either `table`"),
        ("customers: {query: ' ; '}", "customers.query: must be one SELECT statement"),
        ("customers: {table: 12}", "customers.table: must be a name"),
        ("customers: {table: u, columns: [id]}", "customers.columns: must map fields to column"),
        (
            "customers: {table: u, columns: {name: full_name}}",
            "customers.columns: 'name' is not a field of customers; the fields are customer_id",
        ),
        (
            "customers: {table: u, columns: {active: yes}}",
            "customers.columns.active: must be a column name; an expression belongs in a `query`",
        ),
        ("customers: {table: u, columns: {email: null}}", "customers.columns.email: must be a"),
        ("products: {table: p, columns: {image_url: 3}}", "(or null: no such column)"),
        ("customers: {table: u, asset: 'a b'}", "customers.asset: must be an asset key such as"),
        ("orders: {query: SELECT 1, asset: [x]}", "orders.asset: must be an asset key such as"),
        ("customers: {asset: users}", "customers: use either `table`"),
    ],
)
def test_a_malformed_mapping_is_one_line_naming_the_key(tmp_path, config, says):
    with pytest.raises(InvalidSource) as refused:
        read(tmp_path, config)

    assert says in str(refused.value)
    assert str(refused.value).startswith("DIGEST_SOURCE_CONFIG=shop.yaml: ")
    assert "\n" not in str(refused.value)


def test_an_unreadable_or_oversized_file_is_refused(tmp_path):
    with pytest.raises(InvalidSource, match=r"=missing.yaml: cannot be read \(No such file"):
        read_source({"DIGEST_SOURCE_CONFIG": "missing.yaml"}, tmp_path)
    (tmp_path / "big.yaml").write_bytes(b"#" * (300 * 1024))
    with pytest.raises(InvalidSource, match="larger than 256 KiB"):
        read_source({"DIGEST_SOURCE_CONFIG": "big.yaml"}, tmp_path)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("mysql://shop:s3cret@db/shop", "the scheme mysql:// is not supported"),
        ("sqlite://", "names no SQLite file"),
        ("sqlite:///:memory:", "names no SQLite file"),
        ("postgresql://shop:s3cret@db:notaport/shop", "is not a database URL"),
    ],
)
def test_a_bad_source_url_is_refused_without_repeating_it(url, says):
    with pytest.raises(InvalidSource) as refused:
        load_settings({"DIGEST_SOURCE_DATABASE_URL": url}, ROOT)

    assert str(refused.value).startswith("DIGEST_SOURCE_DATABASE_URL")
    assert says in str(refused.value)
    assert "s3cret" not in str(refused.value)


def test_seeding_is_refused_while_either_variable_is_set(tmp_path):
    require_demo_source(SourceSettings())
    with pytest.raises(InvalidSource, match=r"^DIGEST_SOURCE_DATABASE_URL set: digest seed"):
        require_demo_source(SourceSettings("sqlite:///shop.db"))
    with pytest.raises(InvalidSource, match="URL and DIGEST_SOURCE_CONFIG set: digest seed"):
        require_demo_source(read(tmp_path, "{}", DIGEST_SOURCE_DATABASE_URL="sqlite:///s.db"))


# -- values, as the source's column types read them ------------------------------------------


# an engine connects on first use only: here never
SQLITE, POSTGRESQL = sqlite.dialect(), create_engine("postgresql+psycopg://u@h/db").dialect


def _read(field: str, value: object, dialect: Dialect = SQLITE) -> object:
    where = "customers (table users): column c (x)"
    return SourceValue(field, where).result_processor(dialect, None)(value)


@pytest.mark.parametrize(
    ("field", "value", "read_as"),
    [
        ("customer_id", "c-1", "c-1"),
        ("customer_id", 42, "42"),
        ("order_id", UUID(int=1), "00000000-0000-0000-0000-000000000001"),
        ("active", 1, True),
        ("opted_in", 0, False),
        ("opted_in", True, True),
        ("price_cents", Decimal("1200"), 1200),
        ("created_at", "2026-10-12 06:00:00", datetime(2026, 10, 12, 6, tzinfo=UTC)),
        ("created_at", "2026-10-12T08:00:00+02:00", datetime(2026, 10, 12, 6, tzinfo=UTC)),
        ("created_at", date(2026, 10, 12), datetime(2026, 10, 12, tzinfo=UTC)),
        # a `timestamp` without a zone holds UTC
        (
            "ordered_at",
            datetime(2026, 10, 12, 6, tzinfo=UTC).replace(tzinfo=None),
            datetime(2026, 10, 12, 6, tzinfo=UTC),
        ),
    ],
)
def test_a_value_is_read_as_the_domains_type(field, value, read_as):
    got = _read(field, value)
    assert got == read_as
    assert type(got) is type(read_as)


@pytest.mark.parametrize(
    ("field", "value", "found"),
    [
        ("email", 7, "holds a whole number where text is expected"),
        ("email", None, "holds NULL where text is expected"),
        ("active", 2, "holds a whole number where true/false (or 1/0) is expected"),
        ("active", "yes", "holds text where true/false"),
        ("price_cents", 12.5, "holds a fraction where a whole number is expected"),
        ("price_cents", Decimal("12.50"), "holds a fraction"),
        ("price_cents", True, "holds true/false where a whole number"),
        ("ordered_at", "last tuesday", "holds text where a date and time is expected"),
        ("ordered_at", 1_700_000_000, "holds a whole number where a date and time"),
    ],
)
def test_a_wrong_value_is_refused_by_its_kind_never_its_value(field, value, found):
    with pytest.raises(InvalidSource) as refused:
        _read(field, value)

    line = str(refused.value)
    assert line.startswith("customers (table users): column c (x) holds ")
    assert found in line
    assert str(value) not in line


def test_postgresql_times_are_never_parsed_from_text():
    # PostgreSQL would refuse to compare a text column with the window's bounds anyway
    with pytest.raises(InvalidSource, match="holds text where a date and time"):
        _read("ordered_at", "2026-10-12 06:00:00", POSTGRESQL)


def test_a_window_bound_is_sqlite_text_with_a_fraction_only_when_it_has_one():
    midnight = datetime(2026, 10, 19, tzinfo=UTC)
    assert sqlite_instant_text(midnight) == "2026-10-19 00:00:00"
    assert sqlite_instant_text(midnight + timedelta(microseconds=5)) == "2026-10-19 00:00:00.000005"
    assert sqlite_instant_text(midnight.astimezone(timezone(timedelta(hours=2)))) == (
        "2026-10-19 00:00:00"
    )


@pytest.mark.parametrize(
    ("text", "whole", "uuid"),
    [
        ("42", 42, None),
        ("-7", -7, None),
        ("042", None, None),
        ("4_2", None, None),
        (" 42", None, None),
        ("9" * 30, None, None),
        ("customer-1", None, None),
        ("00000000-0000-0000-0000-000000000001", None, "00000000-0000-0000-0000-000000000001"),
        ("00000000000000000000000000000001", None, None),
    ],
)
def test_a_customer_id_is_looked_up_only_in_the_spelling_the_column_gives_back(text, whole, uuid):
    assert whole_id(text) == whole
    assert uuid_id(text) == uuid


def test_the_sampled_ids_decide_how_orders_are_looked_up():
    assert lookup_kind(String(), [1, 2]) == "whole"  # SQLite holds what it is given
    assert lookup_kind(BigInteger(), ["a"]) == "text"
    assert lookup_kind(None, [UUID(int=3)]) == "uuid"
    assert lookup_kind(BigInteger(), []) == "whole"
    assert lookup_kind(Uuid(), []) == "uuid"
    assert lookup_kind(None, []) == "text"
