"""Database errors leave a ledger engine as one short line: the statement, the cause, a few keys.

Never the SQL text or a parameter value: these messages reach stderr and Dagster's event log,
and a bulk statement's parameters hold recipient addresses. The whole exception chain is
checked, not only the message, because a traceback prints every cause.
"""

import io
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, insert, text
from sqlalchemy.exc import IntegrityError, OperationalError, SQLAlchemyError

from digest_pipeline.adapters.sql.engine import (
    LedgerDatabaseError,
    create_ledger_engine,
    describe_statement,
)
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.adapters.sql.schema import eligibility_snapshot, period_runs
from digest_pipeline.cli import main
from digest_pipeline.domain.model import SnapshotEntry
from digest_pipeline_tests.builders import email_of, key_of
from digest_pipeline_tests.conftest import SQL_BACKENDS, T0, W42, require_postgres_url

PROJECT = Path(__file__).resolve().parents[2]
Params = Mapping[str, Any] | Sequence[Mapping[str, Any]]
#: 100 rows of three parameters each: the 300 bound values of one bulk statement
ROWS = 100
#: well above the one line a person reads, far below what 300 parameters would print
SHORT = 500


def chain(error: BaseException) -> Iterator[BaseException]:
    """The error and every cause or context a traceback would print after it."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def chain_text(error: BaseException) -> str:
    return "\n".join(f"{type(e).__name__}: {e} {e!r}" for e in chain(error))


def bulk_rows() -> list[dict[str, str]]:
    return [
        {"key": str(key_of(n)), "recipient": email_of(n), "customer": f"Shopper {n:04d}"}
        for n in range(1, ROWS + 1)
    ]


def assert_safe(error: BaseException) -> None:
    """No address anywhere in what a traceback of `error` prints; one short line."""
    message = str(error)
    assert "\n" not in message
    assert len(message) < SHORT
    printed = chain_text(error)
    assert "@" not in printed
    assert all(email_of(n) not in printed for n in range(1, ROWS + 1))


def in_one_transaction(engine: Engine, *steps: tuple[str, Params]) -> None:
    """Runs (SQL, parameters) steps in one transaction, as a ledger method does."""
    with engine.begin() as conn:
        for sql, params in steps:
            conn.execute(text(sql), params)


@pytest.fixture
def sqlite_engine(sql_engine_factory: Callable[[str], Engine]) -> Engine:
    return sql_engine_factory("sqlite")


def test_a_bulk_insert_into_a_missing_table_names_statement_and_keys_but_no_address(
    sqlite_engine,
):
    bulk_insert = (
        "INSERT INTO no_such_table (operation_key, recipient, customer_id)"
        " VALUES (:key, :recipient, :customer)"
    )
    with pytest.raises(LedgerDatabaseError) as caught:
        in_one_transaction(sqlite_engine, (bulk_insert, bulk_rows()))

    error = caught.value
    message = str(error)
    assert message.startswith("INSERT INTO no_such_table: sqlite3.OperationalError")
    assert "no such table: no_such_table" in message
    assert f"operation keys {key_of(1)}, {key_of(2)}, {key_of(3)} and {ROWS - 3} more" in message
    assert str(key_of(4)) not in message
    assert "Shopper" not in message  # a parameter that is not an operation key
    assert_safe(error)
    # callers that catch SQLAlchemy's own classes still catch it
    assert isinstance(error, OperationalError)
    assert error.statement is None
    assert error.params is None


def _snapshot_with_one_customer_twice(engine: Engine, rows: list[dict[str, str]]) -> None:
    with engine.begin() as conn:
        conn.execute(
            insert(period_runs).values(
                period=str(W42),
                selection_run_id="run-1",
                selected_at=T0,
                eligible_count=0,
                fingerprint="",
            )
        )
        conn.execute(insert(eligibility_snapshot), rows)


def test_a_constraint_violation_is_still_an_integrity_error_and_carries_no_address(
    sqlite_engine,
):
    snapshot_rows = [
        {"period": str(W42), "customer_id": "customer-0001", "recipient": email_of(n)}
        for n in range(1, ROWS + 1)
    ]
    with pytest.raises(IntegrityError) as caught:
        _snapshot_with_one_customer_twice(sqlite_engine, snapshot_rows)

    error = caught.value
    assert isinstance(error, LedgerDatabaseError)
    assert str(error).startswith("INSERT INTO eligibility_snapshot: sqlite3.IntegrityError")
    assert "UNIQUE constraint failed" in str(error)
    assert_safe(error)


@pytest.mark.parametrize("backend", SQL_BACKENDS)
def test_the_ledgers_own_integrity_guard_still_turns_a_duplicate_into_its_refusal(
    sql_engine_factory, backend
):
    entries = [SnapshotEntry("customer-0001", email_of(1)), SnapshotEntry("customer-0001", "x")]

    with pytest.raises(ValueError, match="duplicate customer id") as caught:
        SqlLedger(sql_engine_factory(backend)).freeze_snapshot(W42, "run-1", T0, entries)

    cause = caught.value.__cause__
    assert isinstance(cause, IntegrityError)
    assert isinstance(cause, LedgerDatabaseError)
    # PostgreSQL takes the snapshot by COPY, whose error context quotes the row, address and all
    verb = "COPY" if backend == "postgres" else "INSERT INTO"
    assert str(cause).startswith(f"{verb} eligibility_snapshot: ")
    assert "@" not in chain_text(caught.value)


def test_a_database_error_in_a_command_is_one_line_naming_the_statement(sqlite_engine):
    with sqlite_engine.begin() as conn:
        conn.execute(text("DROP TABLE work_items"))
    url = sqlite_engine.url.render_as_string(hide_password=False)
    out, err = io.StringIO(), io.StringIO()

    code = main(
        ["items", "--period", str(W42)],
        env={"DIGEST_DATABASE_URL": url},
        root=PROJECT,
        out=out,
        err=err,
    )

    assert code == 1
    line = err.getvalue()
    assert line.count("\n") == 1
    assert line.startswith(
        "digest items: error: the ledger database failed: SELECT … FROM work_items:"
        " sqlite3.OperationalError"
    )
    assert "no such table: work_items" in line


@pytest.mark.parametrize(
    ("statement", "named"),
    [
        ("INSERT INTO digest_rows (a) VALUES (?)", "INSERT INTO digest_rows"),
        ('INSERT INTO "digest_rows" (a) VALUES (?)', "INSERT INTO digest_rows"),
        ("UPDATE work_items SET state=? WHERE operation_key = ?", "UPDATE work_items"),
        ("DELETE FROM cleanups WHERE x = 'alice@example.com'", "DELETE FROM cleanups"),
        ('COPY "digest_rows" ("payload") FROM STDIN', "COPY digest_rows"),
        ("SELECT work_items.state \n FROM work_items WHERE x = ?", "SELECT … FROM work_items"),
        (
            "WITH due AS (SELECT k FROM work_items) UPDATE work_items SET state = 'claimed'",
            "WITH … UPDATE work_items",
        ),
        ("CREATE TABLE IF NOT EXISTS attempts (x int)", "CREATE TABLE attempts"),
        ("BEGIN IMMEDIATE", "BEGIN"),
        (None, "connecting"),
    ],
)
def test_a_statement_is_named_by_its_verb_and_table_only(statement, named):
    assert describe_statement(statement) == named


# --- PostgreSQL -------------------------------------------------------------------------------


@pytest.fixture
def pg_engine_of_its_own() -> Iterator[Engine]:
    """A ledger engine on the test database; the statements use a temporary table only."""
    engine = create_ledger_engine(require_postgres_url(), pool_size=1)
    yield engine
    engine.dispose()


PROBE_TABLE = (
    "CREATE TEMP TABLE bulk_probe"
    " (operation_key text NOT NULL, recipient text, customer_id text) ON COMMIT DROP"
)


def _values_clause(rows: int) -> tuple[str, dict[str, str]]:
    clause = ", ".join(f"(:key{i}, :recipient{i}, :customer{i})" for i in range(rows))
    params: dict[str, str] = {}
    for i, row in enumerate(bulk_rows()[:rows]):
        params |= {f"key{i}": row["key"], f"recipient{i}": row["recipient"]}
        params[f"customer{i}"] = row["customer"]
    return clause, params


@pytest.mark.integration
def test_a_bulk_insert_cancelled_by_statement_timeout_names_sqlstate_and_keys(
    pg_engine_of_its_own,
):
    clause, params = _values_clause(ROWS)
    # pg_sleep in the FROM list holds the insert far past the timeout
    slow_insert = (
        "INSERT INTO bulk_probe (operation_key, recipient, customer_id)"
        f" SELECT v.k, v.r, v.c FROM (VALUES {clause}) AS v(k, r, c), pg_sleep(30)"
    )
    with pytest.raises(OperationalError) as caught:
        in_one_transaction(
            pg_engine_of_its_own,
            (PROBE_TABLE, {}),
            ("SET LOCAL statement_timeout = '200ms'", {}),
            (slow_insert, params),
        )

    error = caught.value
    assert isinstance(error, LedgerDatabaseError)
    message = str(error)
    assert message.startswith("INSERT INTO bulk_probe: psycopg.errors.QueryCanceled")
    assert "[SQLSTATE 57014]" in message
    assert f"operation keys {key_of(1)}, {key_of(2)}, {key_of(3)} and {ROWS - 3} more" in message
    assert_safe(error)


@pytest.mark.integration
def test_a_violation_whose_detail_quotes_the_row_leaves_the_address_out_of_every_cause(
    pg_engine_of_its_own,
):
    rows = ", ".join(f"(NULL, :recipient{i}, :customer{i})" for i in range(ROWS))
    _, params = _values_clause(ROWS)
    insert_without_keys = (
        f"INSERT INTO bulk_probe (operation_key, recipient, customer_id) VALUES {rows}"
    )
    with pytest.raises(IntegrityError) as caught:
        in_one_transaction(pg_engine_of_its_own, (PROBE_TABLE, {}), (insert_without_keys, params))

    error = caught.value
    assert isinstance(error, LedgerDatabaseError)
    assert "[SQLSTATE 23502]" in str(error)
    # the server did quote the failing row, address and all; none of it is printed
    assert isinstance(error.orig, psycopg.Error)
    assert email_of(1) in (error.orig.diag.message_detail or "")
    assert_safe(error)


@pytest.mark.integration
def test_a_value_the_server_echoes_is_blanked(pg_engine_of_its_own):
    params = {"recipient": email_of(7), "key": str(key_of(7))}
    with pytest.raises(SQLAlchemyError) as caught:
        in_one_transaction(
            pg_engine_of_its_own, ("SELECT CAST(:recipient AS integer), :key", params)
        )

    error = caught.value
    assert isinstance(error, LedgerDatabaseError)
    assert "invalid input syntax for type integer" in str(error)
    assert str(key_of(7)) in str(error)
    assert email_of(7) not in chain_text(error)


def test_every_ledger_engine_hides_parameters_for_what_the_hook_leaves_alone(tmp_path):
    engines = [create_ledger_engine(f"sqlite:///{tmp_path / 'ledger.db'}")]
    # building a PostgreSQL engine connects to nothing
    engines.append(create_ledger_engine("postgresql+psycopg://u@127.0.0.1:1/db"))
    try:
        assert all(engine.hide_parameters for engine in engines)
    finally:
        for engine in engines:
            engine.dispose()
