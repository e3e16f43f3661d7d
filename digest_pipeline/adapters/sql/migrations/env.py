"""Alembic environment: runs migrations on the connection handed in by `adapters.sql.engine.migrate`."""

from alembic import context

from digest_pipeline.adapters.sql.schema import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through digest_pipeline.adapters.sql.engine.migrate()")
context.configure(
    connection=connection,
    target_metadata=metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
