"""Writes of many rows at once, each statement built once per shape.

`update_many` is one `UPDATE … FROM unnest(arrays)` a chunk and `insert_rows` one `COPY`; SQLite
takes an executemany of a statement compiled once. Plumbing below every role, with statement
caches of its own, so it is kept apart from the roles.
"""

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Json
from sqlalchemy import (
    JSON,
    ColumnElement,
    Connection,
    Dialect,
    Table,
    bindparam,
    func,
    insert,
    update,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.types import TypeEngine

from digest_pipeline.adapters.sql.base import KEYS
from digest_pipeline.adapters.sql.engine import driver_error
from digest_pipeline.domain.chunks import chunked

#: update_many's statements by shape (SQLite's compiled), with the expressions they were built
#: from (see _built)
_UPDATES: dict[tuple[Any, ...], tuple[Any, tuple[ColumnElement[Any], ...]]] = {}
_SHAPES_KEPT = 256


def update_many(
    conn: Connection,
    table: Table,
    match: Sequence[str],
    columns: Mapping[str, ColumnElement[Any] | None],
    rows: Sequence[tuple[Sequence[Any], Mapping[str, Any]]],
    *,
    unset: Sequence[str] = (),
) -> int:
    """`UPDATE table SET …` for many rows, each found by its `match` columns; the rows matched.

    `columns` are the columns set: a `ColumnElement` is one expression for every row, `None`
    takes each row's own value. A row is `(values of match, values of the other columns)`.
    `unset` are columns a row must still find NULL (an attempt not yet closed), or it is not
    matched. On PostgreSQL it is one `UPDATE … FROM unnest(arrays)` statement a chunk (one
    round trip for a wave); SQLite, in process, takes an executemany of the same guarded
    statement.
    """
    own = [c for c, v in columns.items() if v is None]
    if not rows:
        return 0
    if any(len(m) != len(match) for m, _ in rows):
        raise ValueError(f"update_many: each row matches on {len(match)} values")
    built = _built(table, match, columns, tuple(unset), conn.dialect)
    if isinstance(built, _Positional):
        return _execute_positional(conn, built, match, rows)
    matched = 0
    for chunk in chunked(rows, KEYS):
        # one list a column, each built in one comprehension (a wave's rows, column-wise)
        params: dict[str, list[Any]] = {
            f"m_{c}": [m[i] for m, _ in chunk] for i, c in enumerate(match)
        }
        params |= {f"s_{c}": [r[c] for _, r in chunk] for c in own}
        params |= {f"u_{c}": [None] * len(chunk) for c in unset}
        matched += conn.execute(built, params).rowcount
    return matched


def _execute_positional(
    conn: Connection,
    built: "_Positional",
    match: Sequence[str],
    rows: Sequence[tuple[Sequence[Any], Mapping[str, Any]]],
) -> int:
    """SQLite's update_many: one executemany of the statement compiled once."""
    # the parameters built column by column, each through its own bind processing, then
    # zipped into rows: SQLAlchemy's executemany did this row by row
    index = {f"m_{c}": i for i, c in enumerate(match)}
    bound: list[list[Any]] = []
    for name, process, constant in built.sources:
        if name in index:
            i = index[name]
            values = [m[i] for m, _ in rows]
        elif name.startswith("s_"):
            c = name[2:]
            values = [r[c] for _, r in rows]
        else:
            values = [constant] * len(rows)
        bound.append(values if process is None else bound_column(values, process))
    return conn.exec_driver_sql(built.sql, list(zip(*bound, strict=True))).rowcount


def _built(
    table: Table,
    match: Sequence[str],
    columns: Mapping[str, ColumnElement[Any] | None],
    unset: tuple[str, ...],
    dialect: Dialect,
) -> Any:
    """update_many's statement for this shape, built once (not rebuilt and re-keyed a wave).

    The cache is keyed by the ids of the expressions, so a hit is taken only while the very
    same expression objects are passed (module constants); an id reused by a new object after
    the old one was freed fails the identity check and the statement is built anew. SQLite's
    is kept compiled, as a `_Positional`.
    """
    exprs = tuple(e for e in columns.values() if e is not None)
    shape = tuple((c, None if e is None else id(e)) for c, e in columns.items())
    pg = dialect.name == "postgresql"
    key = (table.name, tuple(match), shape, unset, pg)
    cached = _UPDATES.get(key)
    if cached is not None and all(a is b for a, b in zip(cached[1], exprs, strict=True)):
        return cached[0]
    own = [c for c, v in columns.items() if v is None]
    if pg:
        # One array parameter a column, unnested side by side: the statement's text does not
        # depend on the number of rows, so SQLAlchemy compiles it once (VALUES lists did not).
        names = [f"m_{c}" for c in match] + [f"s_{c}" for c in own] + [f"u_{c}" for c in unset]
        arrays = [
            bindparam(n, type_=postgresql.ARRAY(table.c[c].type))
            for n, c in zip(names, [*match, *own, *unset], strict=True)
        ]
        v = func.unnest(*arrays).table_valued(*names).render_derived(name="v")
        stmt = (
            update(table)
            .where(
                *(table.c[c] == v.c[f"m_{c}"] for c in match),
                # `IS NULL` would be a filter on the table, estimated from statistics that see
                # almost every attempt closed: one row. The planner then scans the table for
                # it and joins each open attempt to every row of the wave, a slow plan for
                # the waves of a large week. Compared with a NULL
                # of the wave's rows it is checked after each row is found by its key.
                *(table.c[c].is_not_distinct_from(v.c[f"u_{c}"]) for c in unset),
            )
            .values({c: v.c[f"s_{c}"] if e is None else e for c, e in columns.items()})
        )
    else:
        stmt = (
            update(table)
            .where(
                *(table.c[c] == bindparam(f"m_{c}") for c in match),
                *(table.c[c].is_(None) for c in unset),
            )
            .values({c: bindparam(f"s_{c}") if e is None else e for c, e in columns.items()})
        )
    built = stmt if pg else _positional(stmt, dialect)
    if len(_UPDATES) >= _SHAPES_KEPT:
        _UPDATES.clear()  # a caller passing fresh expressions each time must not grow it forever
    _UPDATES[key] = (built, exprs)
    return built


@dataclass(frozen=True)
class _Positional:
    """An update_many statement compiled for SQLite's positional parameters (`?`)."""

    sql: str
    #: per position: the parameter's name, its bind processor, and its value when it is an
    #: expression's own literal (None for a row's value)
    sources: list[tuple[str, Callable[[Any], Any] | None, Any]]


def _positional(stmt: Any, dialect: Dialect) -> _Positional:
    compiled = stmt.compile(dialect=dialect)
    assert compiled.positiontup is not None, "update_many's SQLite form needs `?` parameters"
    binds = compiled.binds
    sources = [
        (name, _bind(binds[name].type, dialect), binds[name].effective_value)
        for name in compiled.positiontup
    ]
    return _Positional(compiled.string, sources)


def insert_rows(conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
    """Inserts `rows` (dicts of the same columns) in the connection's transaction.

    On psycopg 3 it is one `COPY … FROM STDIN` however many rows: the server runs one statement
    and the client parses no SQL per row (a 1,000-row `INSERT … VALUES` is a long text psycopg
    parses anew each time). On SQLite it is an executemany of the statement compiled once, its
    parameters bound column by column (`_bind`). Elsewhere it is SQLAlchemy's executemany.
    """
    if not rows:
        return
    names = list(rows[0])
    sql = _sqlite_insert(table, names, conn.dialect)
    if sql is None and conn.dialect.driver != "psycopg":
        conn.execute(insert(table), rows)
        return
    # each column's own bind processing (UTC timestamps, JSON), as an INSERT would apply it
    bind = [_bind(table.c[n].type, conn.dialect) for n in names]
    if sql is not None:
        columns = [
            [r[n] for r in rows] if f is None else bound_column([r[n] for r in rows], f)
            for n, f in zip(names, bind, strict=True)
        ]
        conn.exec_driver_sql(sql, list(zip(*columns, strict=True)))
        return
    quote = conn.dialect.identifier_preparer.quote
    statement = f"COPY {quote(table.name)} ({', '.join(map(quote, names))}) FROM STDIN"
    raw = conn.connection.driver_connection
    assert raw is not None
    try:
        with raw.cursor() as cursor, cursor.copy(statement) as copy:
            for row in rows:
                copy.write_row(
                    [row[n] if f is None else f(row[n]) for n, f in zip(names, bind, strict=True)]
                )
    except psycopg.Error as e:
        raise driver_error(statement, rows, e) from None


#: insert_rows' SQLite statements by table and columns (a handful: one per call site)
_INSERTS: dict[tuple[Table, tuple[str, ...]], str | None] = {}


def _sqlite_insert(table: Table, names: Sequence[str], dialect: Dialect) -> str | None:
    """insert_rows' statement on SQLite, compiled once; None elsewhere.

    None too where SQLAlchemy's own insert would add a value: a column left out has a
    Python-side default.
    """
    if dialect.name != "sqlite":
        return None
    key = (table, tuple(names))
    if key not in _INSERTS:
        left_out = [c for c in table.c if c.name not in names and c.default is not None]
        stmt = insert(table).values({n: bindparam(n) for n in names})
        compiled = stmt.compile(dialect=dialect)
        in_order = compiled.positiontup == list(names)
        _INSERTS[key] = None if left_out or not in_order else compiled.string
    return _INSERTS[key]


def bound_column(values: Sequence[Any], process: Callable[[Any], Any]) -> list[Any]:
    """A column's values through its bind processing, once when every row holds the same object.

    A wave's or a cleanup chunk's timestamps are one `now` in every row, and SQLite's datetime
    processing (UTC text) costs far more than the identity test that skips it.
    """
    if not values:
        return []
    first = values[0]
    if all(v is first for v in values):
        return [process(first)] * len(values)
    return [process(v) for v in values]


def _bind(kind: TypeEngine[Any], dialect: Dialect) -> Callable[[Any], Any] | None:
    """A column type's bind processor for one insert; a JSON one encodes each object once.

    Rows often share one payload object (every row of a product, `PickPlan.payloads`). The
    memo is keyed by the object's id, which is safe because every value stays referenced by the
    rows being written until the insert is done.
    """
    process = kind.dialect_impl(dialect).bind_processor(dialect)
    if process is None or not isinstance(kind, JSON):
        return process
    encoded: dict[int, Any] = {}

    def once(value: Any) -> Any:
        k = id(value)
        if k not in encoded:
            bound = process(value)
            # SQLAlchemy hands psycopg a `Json` wrapper, which psycopg would encode again for
            # every row that shares it: the text goes into the COPY instead, encoded once
            if isinstance(bound, Json):
                bound = (bound.dumps or json.dumps)(bound.obj)
            encoded[k] = bound
        return encoded[k]

    return once
