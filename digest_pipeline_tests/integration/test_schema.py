"""The migrations build exactly the schema the code declares, on SQLite and PostgreSQL.

Alembic's autogenerate comparison must find nothing to change: a table or column edited in
`sql_schema.py` without a migration fails here, before it can lose data in production.
"""

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from digest_pipeline.adapters.sql_engine import head_revision, migrate, schema_revision
from digest_pipeline.adapters.sql_schema import metadata


def test_migrated_schema_matches_the_declared_tables(sql_ledger):
    engine = sql_ledger.engine
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        assert compare_metadata(context, metadata) == []


def test_schema_version_is_recorded_at_head_and_migrating_again_is_a_no_op(sql_ledger):
    engine = sql_ledger.engine
    assert schema_revision(engine) == head_revision() == "0003"
    before = sorted(inspect(engine).get_table_names())
    migrate(engine)
    assert schema_revision(engine) == "0003"
    assert sorted(inspect(engine).get_table_names()) == before
    assert {t.name for t in metadata.sorted_tables} <= set(before)
