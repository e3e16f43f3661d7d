"""Engines for the ledger and the schema migrations that prepare them.

SQLite is the embedded default: WAL, a busy timeout and `BEGIN IMMEDIATE` on every transaction
serialize writers, which is what makes claims exclusive there. PostgreSQL relies on row locks
(`FOR UPDATE SKIP LOCKED`) instead.

Every database error that leaves an engine is a `LedgerDatabaseError` whose one-line message
names the statement (`INSERT INTO digest_rows`), the driver's error class with its SQLSTATE and
the first line of its message, and at most three operation keys among the parameters; never the
SQL text or any other parameter, since these messages reach stderr and Dagster's event log and
a bulk statement's parameters hold recipient addresses. Each SQLAlchemy class has a
`LedgerDatabaseError` twin that subclasses it (`LedgerIntegrityError` is an `IntegrityError`),
so code that catches a specific SQLAlchemy error, such as an idempotent insert's
`IntegrityError`, keeps working unchanged. `hide_parameters=True` is the second fence for
anything the hook leaves alone.
"""

import json
import re
from collections.abc import Callable, Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import quote

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from psycopg.types.array import ListBinaryDumper
from sqlalchemy import Engine, create_engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import ExceptionContext, make_url

from digest_pipeline.domain.periods import OperationKey

MIGRATIONS = Path(__file__).parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 30_000
#: operation keys a database error names; enough to find the batch, short enough for one line
ERROR_KEYS_SHOWN = 3
_DRIVER_LINE_MAX = 200
_NAME_MAX = 63  # PostgreSQL's identifier length


class LedgerDatabaseError(sa_exc.StatementError):
    """A database error that left a ledger engine, in words safe for any log (module docstring).

    It carries no statement and no parameters (`statement` and `params` are None); `orig` is the
    driver's exception, its text cut down to the first line this message already shows.
    """

    def __init__(
        self,
        message: str,
        orig: BaseException | None = None,
        *,
        connection_invalidated: bool = False,
    ) -> None:
        # Not DBAPIError.__init__: that one writes the statement and parameters into the text.
        sa_exc.StatementError.__init__(self, message, None, None, orig)
        self.connection_invalidated = connection_invalidated

    def __str__(self) -> str:
        # Without SQLAlchemy's "[SQL: …]" block and "Background on this error" link.
        return str(self.args[0])

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            type(self),
            (self.args[0], None),
            {"connection_invalidated": self.connection_invalidated, "detail": []},
        )


class LedgerDBAPIError(LedgerDatabaseError, sa_exc.DBAPIError):
    """A `DBAPIError` from the ledger's database."""


class LedgerInterfaceError(LedgerDatabaseError, sa_exc.InterfaceError):
    """An `InterfaceError` from the ledger's database."""


class LedgerDatabaseFault(LedgerDatabaseError, sa_exc.DatabaseError):
    """A `DatabaseError` (none of its subclasses) from the ledger's database."""


class LedgerDataError(LedgerDatabaseError, sa_exc.DataError):
    """A `DataError` from the ledger's database."""


class LedgerOperationalError(LedgerDatabaseError, sa_exc.OperationalError):
    """An `OperationalError` (timeout, cancel, lock, connection) from the ledger's database."""


class LedgerIntegrityError(LedgerDatabaseError, sa_exc.IntegrityError):
    """An `IntegrityError` (a constraint refused the row) from the ledger's database."""


class LedgerInternalError(LedgerDatabaseError, sa_exc.InternalError):
    """An `InternalError` from the ledger's database."""


class LedgerProgrammingError(LedgerDatabaseError, sa_exc.ProgrammingError):
    """A `ProgrammingError` (missing table, bad SQL) from the ledger's database."""


class LedgerNotSupportedError(LedgerDatabaseError, sa_exc.NotSupportedError):
    """A `NotSupportedError` from the ledger's database."""


_TWINS: dict[type[sa_exc.StatementError], type[LedgerDatabaseError]] = {
    sa_exc.InterfaceError: LedgerInterfaceError,
    sa_exc.DataError: LedgerDataError,
    sa_exc.OperationalError: LedgerOperationalError,
    sa_exc.IntegrityError: LedgerIntegrityError,
    sa_exc.InternalError: LedgerInternalError,
    sa_exc.ProgrammingError: LedgerProgrammingError,
    sa_exc.NotSupportedError: LedgerNotSupportedError,
    sa_exc.DatabaseError: LedgerDatabaseFault,
    sa_exc.DBAPIError: LedgerDBAPIError,
    # a non-driver error while preparing a statement (a bind processor that raised)
    sa_exc.StatementError: LedgerDatabaseError,
}

_IDENT = r'["`\[]?([A-Za-z_][\w.$]*)'
#: (verb phrase, table) at the start of a statement, most specific first
_SHAPES = (
    re.compile(r"(INSERT(?: OR \w+)? INTO) " + _IDENT, re.IGNORECASE),
    re.compile(r"(UPDATE) " + _IDENT, re.IGNORECASE),
    re.compile(r"(DELETE FROM) " + _IDENT, re.IGNORECASE),
    re.compile(r"(COPY) " + _IDENT, re.IGNORECASE),
    re.compile(
        r"((?:CREATE|ALTER|DROP)(?: UNIQUE)? \w+)(?: IF(?: NOT)? EXISTS)? " + _IDENT,
        re.IGNORECASE,
    ),
)
_FROM = re.compile(r"\bFROM \(?" + _IDENT, re.IGNORECASE)
_ADDRESS = re.compile(r"[^\s\"'<>(),;@]+@[^\s\"'<>(),;@]+")
#: shorter parameter strings are not blanked in the driver's text: they would match its words
_REDACT_MIN = 6


def describe_statement(statement: str | None) -> str:
    """`INSERT INTO digest_rows`, `SELECT … FROM work_items`, `WITH … UPDATE work_items`, `BEGIN`.

    The verb and the table, never the rest: the rest can hold literals.
    """
    if statement is None or not statement.strip():
        return "connecting"
    sql = " ".join(statement.split())
    for shape in _SHAPES:
        if m := shape.match(sql):
            return f"{m.group(1).upper()} {m.group(2)[:_NAME_MAX]}"
    first = sql.split(" ", 1)[0].upper()
    if first == "WITH":
        # the statement a CTE feeds is what ran; its name comes after the CTE's body
        for shape in _SHAPES[:3]:
            if m := shape.search(sql):
                return f"WITH … {m.group(1).upper()} {m.group(2)[:_NAME_MAX]}"
    if first in ("SELECT", "WITH") and (m := _FROM.search(sql)):
        return f"{first} … FROM {m.group(1)[:_NAME_MAX]}"
    return first[:_NAME_MAX]


def _values(parameters: object) -> Iterator[object]:
    """Every scalar in a parameter set: a mapping, a sequence, or a list of either."""
    stack = [parameters]
    while stack:
        value = stack.pop()
        if isinstance(value, Mapping):
            stack.extend(reversed(list(value.values())))
        elif isinstance(value, list | tuple):
            stack.extend(reversed(value))
        else:
            yield value


def _operation_key(value: object) -> str | None:
    # any instance's key, so only its shape: two colons is cheaper to test than a parse
    if not isinstance(value, str) or value.count(":") != 2:
        return None
    key = OperationKey.carried(value)
    return None if key is None else str(key)


def _driver_label(orig: BaseException) -> str:
    """The driver's error class, with its SQLSTATE (or SQLite's error name) where it has one."""
    cls = type(orig)
    name = (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )
    if code := getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None):
        return f"{name} [SQLSTATE {code}]"
    if sqlite_name := getattr(orig, "sqlite_errorname", None):
        return f"{name} [{sqlite_name}]"
    return name


def _first_line(orig: BaseException, secrets: set[str]) -> str:
    """The first line of the driver's message, with what it echoes of the parameters blanked.

    Drivers quote a rejected value (`invalid input syntax for type integer: "…"`); every string
    parameter found in the line, and anything shaped like an address, becomes `…`.
    """
    lines = str(orig).strip().splitlines()
    line = lines[0].strip() if lines else ""
    for secret in sorted(secrets, key=len, reverse=True):
        line = line.replace(secret, "…")
    line = _ADDRESS.sub("…", line)
    if len(line) > _DRIVER_LINE_MAX:
        line = line[: _DRIVER_LINE_MAX - 1] + "…"
    return line or "(no message)"


def summarize_error(
    statement: str | None, parameters: object, orig: BaseException | None
) -> tuple[str, str]:
    """(the one line a database error is told in, the driver's cleaned first line)."""
    keys: dict[str, None] = {}
    secrets: set[str] = set()
    for value in _values(parameters):
        if (key := _operation_key(value)) is not None:
            keys.setdefault(key)
        elif isinstance(value, str) and len(value) >= _REDACT_MIN:
            secrets.add(value)
    driver = "no driver error" if orig is None else _first_line(orig, secrets)
    label = "" if orig is None else f"{_driver_label(orig)}: "
    message = f"{describe_statement(statement)}: {label}{driver}"
    if keys:
        shown = list(keys)[:ERROR_KEYS_SHOWN]
        more = len(keys) - len(shown)
        message += f" (operation keys {', '.join(shown)}{f' and {more} more' if more else ''})"
    return message, driver


def _scrub(cause: BaseException | None, driver_line: str) -> None:
    """Cuts an exception SQLAlchemy chains as `__cause__` down to what the message shows.

    SQLAlchemy raises a handler's replacement `from` the exception it caught (Connection.
    _handle_dbapi_exception), so this hook cannot have `raise … from None`, and a traceback
    prints that cause: psycopg's text goes on with DETAIL lines that quote row values, and a
    StatementError's with the SQL and its parameters.
    """
    if cause is None:
        return
    if isinstance(cause, sa_exc.StatementError):
        cause.statement, cause.params = None, None
        _scrub(cause.orig, driver_line)
        return
    cause.args = (driver_line,)


def _replacement(ctx: ExceptionContext) -> LedgerDatabaseError | None:
    """The project's error in place of the one SQLAlchemy built, or None to leave it be."""
    built = ctx.sqlalchemy_exception
    caught = ctx.original_exception
    # SQLAlchemy re-raises a StatementError it caught as it is: that one carries SQL and params
    wrapped = built if built is not None else caught
    if (
        ctx.is_pre_ping  # the pool reads `connection_invalidated` off its own exception
        or not isinstance(wrapped, sa_exc.StatementError)
        or isinstance(wrapped, LedgerDatabaseError)
    ):
        return None
    orig = caught if wrapped is built else wrapped.orig
    twin = next((_TWINS[c] for c in type(wrapped).__mro__ if c in _TWINS), LedgerDatabaseError)
    message, driver_line = summarize_error(ctx.statement, ctx.parameters, orig)
    _scrub(caught, driver_line)
    return twin(message, orig, connection_invalidated=ctx.is_disconnect)


#: the same twins by DB-API class name, for a driver error raised past SQLAlchemy (a raw COPY):
#: SQLAlchemy's wrappers are named after the DB-API classes they wrap
_DBAPI_TWINS: dict[str, type[LedgerDatabaseError]] = {
    c.__name__: twin for c, twin in _TWINS.items() if issubclass(c, sa_exc.DBAPIError)
}


def driver_error(statement: str, parameters: object, orig: BaseException) -> LedgerDatabaseError:
    """The project's error for a driver error raised past SQLAlchemy, as `_replacement` tells it.

    The caller raises it `from None`: the driver's own text (a COPY's CONTEXT line quotes the
    row) is cut to the line the message shows.
    """
    twin = next(
        (_DBAPI_TWINS[c.__name__] for c in type(orig).__mro__ if c.__name__ in _DBAPI_TWINS),
        LedgerDBAPIError,
    )
    message, driver_line = summarize_error(statement, parameters, orig)
    _scrub(orig, driver_line)
    return twin(message, orig)


def guard_engine_errors(engine: Engine) -> Engine:
    """Installs the error boundary (module docstring) on `engine`; returns it."""

    @event.listens_for(engine, "handle_error", retval=True)
    def _on_error(ctx: ExceptionContext) -> BaseException | None:
        return _replacement(ctx)

    return engine


def _json_loads(data: str | bytes) -> Any:
    """`json.loads` of a text: psycopg hands over bytes, whose encoding `json` would sniff first.

    The sniffing would run on every digest row's payload, a visible cost of a delivery step on
    PostgreSQL.
    """
    return json.loads(data.decode() if isinstance(data, bytes) else data)


#: No JIT compilation, on either driver. A week's bulk-loaded tables and the invariants'
#: correlated subqueries put the planner's estimates past `jit_above_cost`, and compiling costs
#: more than running: the double-send invariant, checked three times a run, would spend most of
#: its time in LLVM. Every ledger statement is short, so none is compiled.
_NO_JIT = "SET jit = off"
#: UTC on psycopg 3's sessions, so psycopg returns every timestamp with `datetime.UTC`. The
#: ledger stores instants; only how they come back changes (`types.UtcDateTime` then passes
#: them on as they are). A psycopg2 session's timestamps are converted instead.
_UTC = "SET TIME ZONE 'UTC'"


def _session_settings(*statements: str) -> Callable[[Any, Any], None]:
    """A connect hook that applies `statements` to each new session, in one transaction."""

    def apply(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        for statement in statements:
            cursor.execute(statement)
        cursor.close()
        dbapi_connection.commit()

    return apply


def _binary_arrays(dbapi_connection: Any, _record: Any) -> None:
    """Array parameters in PostgreSQL's binary format, not its text literal.

    A wave's keys, tokens and times go to the server as arrays (`= ANY(…)`, `unnest(…)`), and
    psycopg builds a text array literal element by element in Python, quoting each one, a large
    share of a cleanup chunk's time. The binary form costs a fraction of that an element. Only
    arrays change; every statement casts its array to the column's type.
    """
    dbapi_connection.adapters.register_dumper(list, ListBinaryDumper)


def create_ledger_engine(url: str, *, pool_size: int = 10, create: bool = True) -> Engine:
    """An engine for `url`; a SQLite file's folder is created if missing.

    With `create=False` the engine only ever opens a SQLite file that exists: no folder is made,
    and the file is opened read-write but not create (SQLite's `mode=rw` URI), so a connection
    to a missing file fails instead of leaving an empty ledger behind.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        # No pre-ping: it is a round trip on every checkout, and every ledger call checks out
        # (it would add three round trips to a wave's two transactions). A connection the server
        # dropped fails its statement instead; SQLAlchemy then discards the whole pool, so one
        # call fails (before a send: nothing left; after: an open attempt that reconciliation
        # settles) and the next connects afresh. Recycling after 30 minutes keeps connections
        # under any idle timeout a proxy or firewall sets.
        engine = create_engine(
            url,
            pool_size=pool_size,
            max_overflow=pool_size,
            pool_recycle=1800,
            hide_parameters=True,
            json_deserializer=_json_loads,
        )
        # A many-row INSERT as multi-row VALUES statements of 1,000 rows, as SQLAlchemy already
        # does for psycopg2 and for INSERT … RETURNING: psycopg 3's executemany otherwise sends
        # one statement per row (340,000 of them for a 100,000-customer week's digest rows).
        engine.dialect.use_insertmanyvalues_wo_returning = True
        if engine.dialect.driver == "psycopg":
            event.listen(engine, "connect", _binary_arrays)
            event.listen(engine, "connect", _session_settings(_NO_JIT, _UTC))
        else:
            event.listen(engine, "connect", _session_settings(_NO_JIT))
        return guard_engine_errors(engine)
    if parsed.database and parsed.database != ":memory:":
        if create:
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        elif parsed.query.get("uri") is None:
            path = Path(parsed.database).absolute().as_posix()
            parsed = parsed.set(
                database=f"file:{quote(path)}", query={**parsed.query, "mode": "rw", "uri": "true"}
            )
    engine = guard_engine_errors(
        create_engine(
            parsed,
            connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
            pool_size=pool_size,
            max_overflow=pool_size,
            hide_parameters=True,
        )
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control away from the sqlite3 module so BEGIN IMMEDIATE is ours.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        # Stated, not left to the build's default: under WAL, NORMAL lets a power cut undo a
        # commit (an "attempt started" row, so a digest goes out twice) and OFF a process crash.
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def _alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


def migrate(engine: Engine, revision: str = "head") -> None:
    """Brings the schema up to `revision`; safe to call on every start.

    On SQLite the foreign keys are off while the migrations run, and checked whole before the
    commit: a batch rebuild drops and recreates a table others reference (0008's
    `work_items`), which a per-statement check refuses, and SQLite turns the check off only
    outside a transaction (its documented ALTER TABLE procedure).

    A database already at the head is left alone, without a look at its rows: that foreign-key
    check reads every table whole, a cost that grows with the history and comes at every start
    (three a run).
    """
    if revision == "head" and schema_revision(engine) == head_revision():
        return
    cfg = _alembic_config()
    with engine.connect() as conn:
        sqlite = conn.dialect.name == "sqlite"
        raw: Any = conn.connection.driver_connection if sqlite else None
        if sqlite:
            raw.execute("PRAGMA foreign_keys=OFF")
        try:
            with conn.begin():
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, revision)
                if sqlite and conn.exec_driver_sql("PRAGMA foreign_key_check").first():
                    raise RuntimeError("a migration left rows whose foreign keys match nothing")
        finally:
            if sqlite:
                raw.execute("PRAGMA foreign_keys=ON")


def schema_revision(engine: Engine) -> str | None:
    """The revision the database is at (None for an empty database)."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


@cache
def head_revision() -> str | None:
    """The newest revision this code ships (read from the migration scripts once a process)."""
    return ScriptDirectory.from_config(_alembic_config()).get_current_head()
