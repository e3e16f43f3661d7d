"""A mapped shop source, built and checked before anything is read for real.

It opens the shop's database (read-only), looks each mapped table and column up (reflection) or
asks each query for its columns (`LIMIT 0`), checks declared types on PostgreSQL, runs every
statement the source will run with `LIMIT 0`, and reads at most `SAMPLE_ROWS` rows of each record
kind through the same column types. No whole table is read. The first problem is
`InvalidSource`: one line naming the variable, the record kind with its table or query, and the
column, so a bad mapping stops a command or a run before anything is frozen or recorded.
"""

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import (
    Boolean,
    Connection,
    Date,
    DateTime,
    Engine,
    Integer,
    Numeric,
    String,
    Uuid,
    column,
    create_engine,
    event,
    inspect,
    literal_column,
    null,
    select,
    table,
    text,
    type_coerce,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool
from sqlalchemy.types import NullType, TypeEngine

from digest_pipeline.adapters.sql import customer_source as cs
from digest_pipeline.adapters.sql.engine import LedgerDatabaseError, guard_engine_errors
from digest_pipeline.adapters.sql.identity import missing_sqlite_file
from digest_pipeline.adapters.sql.source_types import (
    KINDS,
    SourceValue,
    expected,
    lookup,
    lookup_kind,
)
from digest_pipeline.source_settings import (
    FIELDS,
    OPTIONAL,
    URL_VARIABLE,
    EntitySource,
    InvalidSource,
    SourceSettings,
)

#: rows of each record kind read to check their values: a handful, never the table
SAMPLE_ROWS = 5
SQLITE_READ_TIMEOUT_SECONDS = 30
#: a customer id of each lookup kind that the `LIMIT 0` lookup statement binds
_PROBE_IDS = {"whole": 0, "uuid": "00000000-0000-0000-0000-000000000000", "text": ""}
#: declared PostgreSQL types each field kind accepts (SQLite declares nothing it enforces, so
#: there only the values are checked)
_ACCEPTS: dict[str, tuple[type[TypeEngine[Any]], ...]] = {
    "id": (String, Integer, Uuid),
    "text": (String,),
    "flag": (Boolean, Integer),
    "whole": (Integer, Numeric),
    "instant": (DateTime, Date),
}
# a bind parameter in `text()`: a colon that starts a word and does not follow a word or a colon
_BIND = re.compile(r"(?<![:\w\\]):(?=\w)")
_PLAIN = re.compile(r"[A-Za-z_][\w$]*")
Columns = dict[str, Any]


def source_engine(url: str) -> Engine:
    """A read-only engine on the shop's database; each read its own connection (NullPool).

    SQLite opens an existing file read-only (`mode=ro`): never created, never written, and no
    journal mode imposed on it. PostgreSQL sessions are read-only transactions in UTC, so a
    `timestamp` column without a zone compares with a window bound as UTC.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        assert parsed.database is not None  # source_settings refuses a URL without a file
        if parsed.query.get("uri") is None:
            path = Path(parsed.database).absolute().as_posix()
            parsed = parsed.set(
                database=f"file:{quote(path)}", query={**parsed.query, "mode": "ro", "uri": "true"}
            )
        return guard_engine_errors(
            create_engine(
                parsed,
                poolclass=NullPool,
                hide_parameters=True,
                connect_args={"check_same_thread": False, "timeout": SQLITE_READ_TIMEOUT_SECONDS},
            )
        )
    engine = create_engine(parsed, poolclass=NullPool, hide_parameters=True)
    event.listen(engine, "connect", _read_only_utc)
    return guard_engine_errors(engine)


def _read_only_utc(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("SET TIME ZONE 'UTC'")
    cursor.execute("SET default_transaction_read_only = on")
    cursor.close()
    dbapi_connection.commit()


def open_mapped_source(source: SourceSettings, ledger_engine: Engine) -> cs.SqlCustomerSource:
    """The source `source` describes, on its own database or the ledger's, checked.

    Raises:
        InvalidSource: the database cannot be opened, or a record kind cannot be read as mapped.
    """
    if source.database_url is None:
        engine = ledger_engine
    else:
        if (path := missing_sqlite_file(source.database_url)) is not None:
            raise InvalidSource(f"{URL_VARIABLE}: no SQLite file at {path.absolute()}")
        engine = source_engine(source.database_url)
    reader = cs.reader_engine(engine)
    prefix = f"{source.variable}={source.config}" if source.config else source.variable
    try:
        conn = reader.connect()
    except SQLAlchemyError as e:
        raise InvalidSource(
            f"{source.variable}: cannot open the source database: {_line(e)}"
        ) from None
    with conn:
        found = {e: _resolve(conn, source.entity(e), prefix) for e in FIELDS}
        columns, kind = _columns(conn, found, source, prefix)
        _check(conn, columns, kind, source, prefix)
    return cs.SqlCustomerSource(reader, columns)


def _line(e: SQLAlchemyError) -> str:
    """The database's refusal in one line, as the ledger's engine words it (no parameters).

    Without the engine's statement description: the refusal already names the table or query.
    """
    if isinstance(e, LedgerDatabaseError):
        return str(e).split(": ", 1)[-1]
    return str(getattr(e, "orig", None) or e).strip().splitlines()[0]


def _resolve(
    conn: Connection, spec: EntitySource, prefix: str
) -> tuple[Columns, TypeEngine[Any] | None]:
    """The record kind's columns by field, and the declared type of its customer id column."""
    try:
        if spec.query is not None:
            return _query_columns(conn, spec, prefix), None
        return _table_columns(conn, spec, prefix)
    except SQLAlchemyError as e:
        raise InvalidSource(
            f"{prefix}: {spec.origin}: the database refused it: {_line(e)}"
        ) from None


def _table_columns(
    conn: Connection, spec: EntitySource, prefix: str
) -> tuple[Columns, TypeEngine[Any] | None]:
    assert spec.table is not None
    look = inspect(conn)
    if not look.has_table(spec.table, schema=spec.schema):
        raise InvalidSource(f"{prefix}: {spec.origin}: no such table in the source database")
    declared = {c["name"]: c["type"] for c in look.get_columns(spec.table, schema=spec.schema)}
    # every name is a quoted identifier in the SQL: a mapped value is never read as SQL
    t = table(spec.table, *(column(name) for name in declared), schema=spec.schema)
    pg = conn.dialect.name == "postgresql"
    columns: Columns = {}
    for f, name in spec.columns:
        where = f"{prefix}: {spec.origin}: column {name} ({f})"
        if name is None:  # an optional field the shop does not have
            columns[f] = type_coerce(null(), SourceValue(f, where, nullable=True))
            continue
        if name not in declared:
            hint = "" if _PLAIN.fullmatch(name) else "; an expression belongs in a `query`"
            raise InvalidSource(f"{prefix}: {spec.origin}: no column {name} (for {f}){hint}")
        if pg and not isinstance(declared[name], (*_ACCEPTS[KINDS[f]], NullType)):
            raise InvalidSource(f"{where} is {declared[name]} where {expected(f)} is expected")
        columns[f] = type_coerce(t.c[name], SourceValue(f, where, nullable=f in OPTIONAL))
    by_field = dict(spec.columns)
    customer = by_field.get("customer_id") if spec.entity == "orders" else None
    return columns, declared.get(customer) if customer else None


def _query_columns(conn: Connection, spec: EntitySource, prefix: str) -> Columns:
    assert spec.query is not None
    # the query is SQL as written: a `:word` in it is text, never a parameter to bind
    query = _BIND.sub(r"\\:", spec.query)
    probe = text(query).columns().subquery("src")
    names = set(conn.execute(select(literal_column("*")).select_from(probe).limit(0)).keys())
    for f in FIELDS[spec.entity]:
        if f not in names:
            raise InvalidSource(
                f"{prefix}: {spec.origin}: its result has no column {f} (name one `… AS {f}`)"
            )
    typed = [
        column(f, SourceValue(f, f"{prefix}: {spec.origin}: column {f}", f in OPTIONAL))
        for f in FIELDS[spec.entity]
    ]
    src = text(query).columns(*typed).subquery("src")
    return {f: src.c[f] for f in FIELDS[spec.entity]}


def _columns(
    conn: Connection,
    found: dict[str, tuple[Columns, TypeEngine[Any] | None]],
    source: SourceSettings,
    prefix: str,
) -> tuple[cs.SourceColumns, str]:
    """The source's columns, the order lookup typed as its customer ids are held, and that kind."""
    orders, declared = found["orders"]
    try:
        raw = type_coerce(orders["customer_id"], NullType())
        sampled = conn.execute(select(raw).limit(SAMPLE_ROWS)).scalars().all()
    except SQLAlchemyError as e:
        origin = source.entity("orders").origin
        raise InvalidSource(f"{prefix}: {origin}: the database refused it: {_line(e)}") from None
    kind = lookup_kind(declared, [v for v in sampled if v is not None])
    bind, convert = lookup(kind)
    columns = cs.SourceColumns(
        found["customers"][0],
        found["products"][0],
        orders,
        type_coerce(orders["customer_id"], bind),
        convert,
    )
    return columns, kind


def _check(
    conn: Connection, columns: cs.SourceColumns, kind: str, source: SourceSettings, prefix: str
) -> None:
    """Runs every statement with `LIMIT 0`, then reads a few rows of each kind through its types."""
    until = datetime(2026, 1, 5, tzinfo=UTC)
    since = until - timedelta(weeks=12)
    pg = conn.dialect.name == "postgresql"
    statements = {
        "customers": [cs.customers_query(columns)],
        "products": [cs.products_query(columns)],
        "orders": [
            cs.orders_query(columns, since, until),
            cs.popularity_query(columns, since, until),
            cs.orders_of_query(columns, [_PROBE_IDS[kind]], since, until, pg),
        ],
    }
    for entity, queries in statements.items():
        try:
            for q in queries:
                conn.execute(q.limit(0)).all()
            fields = getattr(columns, entity)
            conn.execute(select(*fields.values()).limit(SAMPLE_ROWS)).all()
        except SQLAlchemyError as e:
            origin = source.entity(entity).origin
            raise InvalidSource(
                f"{prefix}: {origin}: the database refused it: {_line(e)}"
            ) from None
