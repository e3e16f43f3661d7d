"""The migrations build exactly the schema the code declares, on SQLite and PostgreSQL.

Alembic's autogenerate comparison must find nothing to change: a table or column edited in
`adapters/sql/schema.py` without a migration fails here, before it can lose data in production. A ledger
left in a broken state by an older schema must upgrade with all of its data.
"""

from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, event, inspect, select, text, update
from sqlalchemy.exc import IntegrityError

from digest_pipeline.adapters.sql.engine import (
    create_ledger_engine,
    head_revision,
    migrate,
    schema_revision,
)
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.adapters.sql.schema import (
    digest_rows,
    digest_rows_archive,
    metadata,
    work_items,
)
from digest_pipeline.domain.feedback import Suppression, SuppressionReason
from digest_pipeline.domain.model import CleanupMode
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.services.cleanup import clean_period
from digest_pipeline_tests.builders import (
    ROWS_PER_CUSTOMER,
    deliver_all,
    failed_invariants,
    key_of,
    make_deliverer,
    seed_period,
)
from digest_pipeline_tests.conftest import SQL_BACKENDS, T0, W42
from digest_pipeline_tests.fakes import FakeMailer, FixedClock


def test_migrated_schema_matches_the_declared_tables(sql_ledger):
    engine = sql_ledger.engine
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        assert compare_metadata(context, metadata) == []


def test_schema_version_is_recorded_at_head_and_migrating_again_is_a_no_op(sql_ledger):
    engine = sql_ledger.engine
    assert schema_revision(engine) == head_revision() == "0012"
    before = sorted(inspect(engine).get_table_names())
    migrate(engine)
    assert schema_revision(engine) == "0012"
    assert sorted(inspect(engine).get_table_names()) == before
    assert {t.name for t in metadata.sorted_tables} <= set(before)


def _ledger_at(request: pytest.FixtureRequest, tmp_path: Path, revision: str) -> Iterator[Engine]:
    """A ledger migrated only to `revision` (PostgreSQL: the shared database, put back after)."""
    if request.param == "sqlite":
        engine = create_ledger_engine(f"sqlite:///{tmp_path / f'ledger-{revision}.db'}")
        migrate(engine, revision)
        yield engine
        engine.dispose()
        return
    engine = request.getfixturevalue("pg_engine")
    _recreate_pg(engine, revision)
    try:
        yield engine
    finally:
        _recreate_pg(engine, "head")


@pytest.fixture
def ledger_at_0003(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    yield from _ledger_at(request, tmp_path, "0003")


@pytest.fixture
def ledger_at_0007(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    yield from _ledger_at(request, tmp_path, "0007")


def _recreate_pg(engine: Engine, revision: str) -> None:
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    # pooled connections may hold prepared statements for the tables just dropped
    engine.dispose()
    migrate(engine, revision)


def _week(ledger: SqlLedger, clock: FixedClock, period: Period, customers: int) -> None:
    seed_period(ledger, customers, period=period, now=clock.now())
    deliver_all(make_deliverer(ledger, FakeMailer(clock=clock), clock), period=period)


def _sent_by_older_code(
    ledger: SqlLedger, clock: FixedClock, period: Period, customers: int
) -> None:
    """A week an older release delivered: its items `sent`, as that release's code left them.

    Today's deliverer writes columns (the attempt's mailer) and reads tables (the suppression
    list) an older schema does not have, so the older delivery is written as its result.
    """
    seed_period(ledger, customers, period=period, now=clock.now())
    with ledger.engine.begin() as conn:
        conn.execute(
            update(work_items)
            .where(work_items.c.period == str(period))
            .values(state=DeliveryState.SENT.value, sent_at=clock.now(), updated_at=clock.now())
        )


def _columns(engine: Engine) -> dict[str, list[str]]:
    """The ledger tables the database holds now, each with the columns it has now."""
    found = inspect(engine)
    names = set(found.get_table_names())
    return {
        t.name: [c["name"] for c in found.get_columns(t.name)]
        for t in metadata.sorted_tables
        if t.name in names
    }


def _dump(engine: Engine, columns: dict[str, list[str]]) -> dict[str, list[str]]:
    """Every row of the tables and columns `columns` (`_columns`), in a stable order."""
    with engine.connect() as conn:
        return {
            t.name: sorted(
                repr(tuple(r)) for r in conn.execute(select(*(t.c[c] for c in columns[t.name])))
            )
            for t in metadata.sorted_tables
            if t.name in columns
        }


@pytest.mark.parametrize("ledger_at_0003", SQL_BACKENDS, indirect=True)
def test_a_ledger_that_reused_row_ids_upgrades_with_its_data_and_cleans_again(
    ledger_at_0003, monkeypatch
):
    engine = ledger_at_0003
    ledger, clock = SqlLedger(engine), FixedClock(T0)
    # the delivery code of 0003's time had no suppression list (0007) to read
    monkeypatch.setattr(SqlLedger, "cancel_suppressed", lambda self, now, period=None: [])
    week_1, week_2, week_3 = (
        Period.of((W42.starts_at + timedelta(weeks=n)).date()) for n in (0, 1, 2)
    )
    _sent_by_older_code(ledger, clock, week_1, 3)
    clean_period(ledger, clock, week_1, CleanupMode.ARCHIVE)
    if engine.dialect.name == "postgresql":
        # PostgreSQL never reuses a serial id by itself; a ledger restored without its
        # sequence position does, which is the state SQLite reaches on its own
        with engine.begin() as conn:
            conn.execute(text("ALTER SEQUENCE digest_rows_row_id_seq RESTART WITH 1"))
    clock.advance(timedelta(weeks=1))
    _sent_by_older_code(ledger, clock, week_2, 2)
    with engine.connect() as conn:
        live = set(conn.execute(select(digest_rows.c.row_id)).scalars())
        archived = set(conn.execute(select(digest_rows_archive.c.row_id)).scalars())
    # the state the bug leaves: every live row carries an id the archive already holds
    assert live
    assert live < archived
    with pytest.raises(IntegrityError):
        clean_period(ledger, clock, week_2, CleanupMode.ARCHIVE)
    tables = _columns(engine)
    before = _dump(engine, tables)

    migrate(engine)
    monkeypatch.undo()

    assert schema_revision(engine) == head_revision()
    assert _dump(engine, tables) == before
    report = clean_period(ledger, clock, week_2, CleanupMode.ARCHIVE)
    assert (report.cleaned, report.rows) == (2, 2 * ROWS_PER_CUSTOMER)
    assert {i.state for i in ledger.items(week_2)} == {DeliveryState.CLEANED}
    # a new row's id is above every id the archive holds, not only the live ones
    _week(ledger, clock, week_3, 1)
    with engine.connect() as conn:
        fresh = set(conn.execute(select(digest_rows.c.row_id)).scalars())
        archived = set(conn.execute(select(digest_rows_archive.c.row_id)).scalars())
    assert min(fresh) > max(archived)
    assert clean_period(ledger, clock, week_3, CleanupMode.ARCHIVE).cleaned == 1
    with engine.connect() as conn:
        keys = conn.execute(select(digest_rows_archive.c.operation_key)).scalars().all()
    cleaned = [str(i.key) for p in (week_1, week_2, week_3) for i in ledger.items(p)]
    assert Counter(keys) == dict.fromkeys(cleaned, ROWS_PER_CUSTOMER)
    for period in (week_1, week_2, week_3):
        assert failed_invariants(ledger, period, clock.now()) == []


@pytest.mark.parametrize("ledger_at_0007", SQL_BACKENDS, indirect=True)
def test_a_0007_ledger_upgrades_with_its_items_and_then_holds_a_suppressed_one(ledger_at_0007):
    engine = ledger_at_0007
    ledger, clock = SqlLedger(engine), FixedClock(T0)
    seed_period(ledger, 3, now=clock.now())
    # the constraint 0007 built refuses the new state
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(update(work_items).values(state=DeliveryState.SUPPRESSED.value))
    tables = _columns(engine)
    before = _dump(engine, tables)

    migrate(engine)

    assert schema_revision(engine) == head_revision()
    assert _dump(engine, tables) == before
    gone = key_of(2)
    ledger.suppress(Suppression(gone.customer_id, SuppressionReason.OPERATOR, "operator:o", T0))
    states = {i.key: i.state for i in ledger.items(W42)}
    assert states == {
        key_of(1): DeliveryState.PENDING,
        gone: DeliveryState.SUPPRESSED,
        key_of(3): DeliveryState.PENDING,
    }
    # every other constraint survived the rebuild
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(update(work_items).values(state="sending"))
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(update(work_items).values(last_failure_class="cosmic"))


def test_a_sqlite_migration_that_would_leave_a_dangling_reference_commits_nothing(tmp_path):
    engine = create_ledger_engine(f"sqlite:///{tmp_path / 'dangling.db'}")
    migrate(engine, "0007")
    # a row no foreign-key-checked write could make: written with the check off
    with engine.connect() as conn:
        raw: Any = conn.connection.driver_connection
        raw.execute("PRAGMA foreign_keys=OFF")
        raw.execute(
            "INSERT INTO attempts (operation_key, number, lease_token, worker, started_at,"
            " duplicate) VALUES ('digest:2026-W42:nobody', 1, 1, 'w', '2026-10-19 00:00:00', 0)"
        )
        raw.execute("PRAGMA foreign_keys=ON")

    with pytest.raises(RuntimeError, match="foreign keys"):
        migrate(engine)

    assert schema_revision(engine) == "0007"
    engine.dispose()


def test_starting_on_a_sqlite_ledger_at_head_reads_nothing_but_its_revision(tmp_path):
    # Every resource of a run and every command migrates as it starts. The foreign-key check a
    # migration needs reads every table whole: on a year of weeks it cost each start (three a
    # run) as much as a small week's delivery, so a ledger already at head must skip it.
    engine = create_ledger_engine(f"sqlite:///{tmp_path / 'current.db'}")
    migrate(engine)
    seen: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: seen.append(a[2]))

    migrate(engine)

    read = [statement for statement in seen if statement != "BEGIN IMMEDIATE"]
    assert read, "the revision is read"
    assert all("alembic_version" in statement for statement in read), read
    engine.dispose()
