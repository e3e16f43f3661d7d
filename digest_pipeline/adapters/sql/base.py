"""What every role of the SQL ledger shares: the engine, the dialect and the insert it needs."""

import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from psycopg.types.json import Json
from sqlalchemy import (
    JSON,
    ColumnElement,
    Connection,
    Dialect,
    Engine,
    Select,
    Table,
    and_,
    bindparam,
    func,
    insert,
    literal,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError
from sqlalchemy.types import TypeEngine

from digest_pipeline.adapters.sql.engine import driver_error
from digest_pipeline.adapters.sql.invariants import Seal
from digest_pipeline.adapters.sql.schema import (
    CLAIMABLE_SQL,
    audit_log,
    period_runs,
    work_items,
)
from digest_pipeline.domain.chunks import chunked
from digest_pipeline.domain.errors import DigestError, LostRace, UnknownWorkItem
from digest_pipeline.domain.model import (
    AuditEntry,
    SnapshotInfo,
)
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.states import DeliveryState

logger = logging.getLogger(__name__)
CHUNK = 5_000
#: what `SqlBase._pages` makes of each row
T = TypeVar("T")
#: an enqueue that creates this many items refreshes the table's planner statistics, and a
#: table this many rows past twice its last analysis is analysed again
ANALYZE_AFTER = 1_000
#: how long a statistics refresh waits for a table another VACUUM or ANALYZE holds
ANALYZE_LOCK_TIMEOUT_MS = 2_000
#: keys per `IN (…)` list: far below every driver's bound-parameter limit
KEYS = 500
wi = work_items


def due_clause(now: datetime, period: Period | None) -> ColumnElement[bool]:
    """Items `claim_due` may hand out now (in one period, or any)."""
    due = and_(text(f"work_items.{CLAIMABLE_SQL}"), wi.c.next_attempt_at <= now)
    return due if period is None else and_(due, wi.c.period == str(period))


def locked_items(keys: Sequence[str], pg: bool, *columns: ColumnElement[Any]) -> Select[Any]:
    """`columns` of the work items `keys`, read and locked (`FOR UPDATE`) in key order.

    Every transaction that locks many items takes them in this one order, whatever its plan: two
    cleaners of one page, one planned as a scan of the table and one through the key index,
    otherwise locked its rows in opposite orders, and PostgreSQL aborted one with `deadlock
    detected`. (SQLite's `BEGIN IMMEDIATE` serialises writers; the order costs it nothing.)
    """
    return (
        select(*columns)
        .where(one_of(wi.c.operation_key, keys, pg))
        .order_by(wi.c.operation_key)
        .with_for_update()
    )


def sqlite_statistics_outgrown(conn: Connection, table: Table) -> bool:
    """Whether SQLite's statistics of `table` are missing or outgrown (as PostgreSQL's are judged).

    Outgrown: the table's rows now exceed twice those of its last analysis by `ANALYZE_AFTER`
    (`_refresh_statistics`'s rule). SQLite's ANALYZE reads the whole table and each of its
    indexes, so analysing at every enqueue would slow each one as the ledger's history grows.
    Its statistics (sqlite_stat1) are averages per index prefix, not per value, so a new week's
    rows look like the last week's; refreshed only as the table doubles, all the analyses of a
    growing ledger cost about twice its last one.
    """
    analysed = None
    if conn.exec_driver_sql("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_stat1'").first():
        # each index's row starts with the table's row count at the analysis
        q = text("SELECT max(CAST(stat AS INTEGER)) FROM sqlite_stat1 WHERE tbl = :t")
        analysed = conn.execute(q, {"t": table.name}).scalar()
    if analysed is None:
        return True
    rows = conn.execute(select(func.count()).select_from(table)).scalar_one()
    return bool(rows > ANALYZE_AFTER + 2 * analysed)


def one_of(column: Any, values: Iterable[Any], pg: bool) -> ColumnElement[bool]:
    """`column IN values`; on PostgreSQL `column = ANY(array)`, one parameter however many.

    A 500-item `IN (…)` list is 500 parameters the server plans anew each time; the array form
    is one parameter, and reads a week's orders in far less time.
    """
    if pg:
        clause: ColumnElement[bool] = column == func.any(
            literal(list(values), postgresql.ARRAY(column.type))
        )
        return clause
    listed: ColumnElement[bool] = column.in_(list(values))
    return listed


def period_items(period: Period, states: Iterable[DeliveryState] | None) -> Select[Any]:
    """A period's work items, optionally only in some states."""
    q = select(wi).where(wi.c.period == str(period))
    return q if states is None else q.where(wi.c.state.in_([s.value for s in states]))


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


def audit_row(e: AuditEntry) -> dict[str, Any]:
    """An audit entry as an `audit_log` row."""
    period = e.period or (e.key.period if e.key else None)
    return {
        "at": e.at,
        "actor": e.actor,
        "action": e.action,
        "period": str(period) if period else None,
        "operation_key": str(e.key) if e.key else None,
        "from_state": e.from_state.value if e.from_state else None,
        "to_state": e.to_state.value if e.to_state else None,
        "reason": e.reason,
    }


class SqlBase:
    """The engine and dialect every role of the SQL ledger works on."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._pg = engine.dialect.name == "postgresql"
        #: `Ledger.out_of_process`: PostgreSQL works in its server, SQLite on this process's CPU
        self.out_of_process = self._pg
        #: PostgreSQL snapshots this ledger fingerprinted whole, by period (`invariants.Seal`);
        #: None on SQLite, which has no row-version stamp to seal with
        self._seals: dict[str, Seal] | None = {} if self._pg else None

    @property
    def engine(self) -> Engine:
        return self._engine

    def _pages(
        self, q: Select[Any], key: ColumnElement[str], convert: Callable[[Any], T], page: int
    ) -> Iterator[T]:
        """`q`'s rows as `convert` makes them, read `page` at a time in `key` order.

        Keyset pagination on a unique `key` that `q` selects: each page is its own short read,
        nothing is held open between them, and a page is read only once the caller has taken
        every row of the one before (so what it wrote meanwhile is seen).
        """
        after: str | None = None
        name = key.name
        while True:
            paged = q if after is None else q.where(key > after)
            with self._engine.connect() as conn:
                rows = conn.execute(paged.order_by(key).limit(page)).mappings().all()
                converted = [convert(r) for r in rows]
            yield from converted
            if len(rows) < page:
                return
            after = rows[-1][name]

    def _refresh_statistics(self, tables: Sequence[Table], written: int = 0) -> None:
        """ANALYZEs each table that outgrew what the planner believes it holds (PostgreSQL only).

        A table is stale once its rows (autovacuum's live count, plus `written`: rows this
        process has just written, which that count may not show yet) exceed twice the rows of
        its last analysis by `ANALYZE_AFTER`. A ledger's phases fill tables faster than
        autovacuum looks: content writes a week's digest rows and delivery its attempts, and
        the next reads by key would be planned for the table as it was, empty (a parallel scan
        of every digest row for each wave). Runs in its own short transaction, never inside one
        that holds row locks, so two workers' ANALYZEs can only wait for each other.
        """
        if not self._pg:
            return
        stale = text(
            "SELECT c.relname FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid"
            " WHERE c.oid = ANY(CAST(:names AS regclass[]))"
            " AND s.n_live_tup + :written > :floor + 2 * GREATEST(c.reltuples, 0)"
        )
        names = [t.name for t in tables]
        with self._engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            params = {"names": names, "written": written, "floor": ANALYZE_AFTER}
            todo = list(conn.execute(stale, params).scalars())
            if not todo:
                return
            # An optimisation only, so it never holds the caller up for long nor fails it: a
            # VACUUM that holds the table (an operator's; autovacuum gives way) or a standby
            # leaves the plans as they are, with a warning.
            conn.exec_driver_sql(f"SET lock_timeout = '{ANALYZE_LOCK_TIMEOUT_MS}ms'")
            try:
                for name in todo:
                    quoted = conn.dialect.identifier_preparer.quote(name)
                    try:
                        conn.exec_driver_sql(f"ANALYZE {quoted}")
                    except DBAPIError as e:
                        logger.warning("statistics of %s not refreshed: %s", name, e)
            finally:
                conn.exec_driver_sql("RESET lock_timeout")

    def _insert(self, table: Any) -> postgresql.Insert | sqlite.Insert:
        return postgresql.insert(table) if self._pg else sqlite.insert(table)

    def _snapshot_info(self, conn: Connection, period: Period) -> SnapshotInfo | None:
        r = (
            conn.execute(select(period_runs).where(period_runs.c.period == str(period)))
            .mappings()
            .first()
        )
        if r is None:
            return None
        return SnapshotInfo(
            period=period,
            selection_run_id=r["selection_run_id"],
            selected_at=r["selected_at"],
            eligible_count=r["eligible_count"],
            fingerprint=r["fingerprint"],
            enqueued_at=r["enqueued_at"],
        )

    def _insert_audit(self, conn: Connection, e: AuditEntry) -> None:
        conn.execute(insert(audit_log).values(audit_row(e)))

    def _missing_or_lost(
        self, conn: Connection, keys: Sequence[OperationKey], why: str
    ) -> dict[str, DigestError]:
        """The error for each key that matched no guarded row: unknown key, or a lost race."""
        states: dict[str, str] = {}
        for chunk in chunked([str(k) for k in keys], KEYS):
            q = select(wi.c.operation_key, wi.c.state).where(wi.c.operation_key.in_(chunk))
            states.update((k, state) for k, state in conn.execute(q))
        return {
            str(k): (
                LostRace(f"{k}: {why}; it is {states[str(k)]}")
                if str(k) in states
                else UnknownWorkItem(f"no work item for {k}")
            )
            for k in keys
        }
