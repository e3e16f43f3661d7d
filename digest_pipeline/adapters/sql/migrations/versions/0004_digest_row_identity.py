"""Generated rows keep an identity that cleanup cannot hand out again.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-08

Up to 0003, SQLite reused the ids of deleted `digest_rows` and the archive was keyed by `row_id`
alone, so the week after a cleanup failed to archive its rows and its items stayed `sent`.
`digest_rows` now gets `AUTOINCREMENT` on SQLite, and its id sequence (`sqlite_sequence`, or
PostgreSQL's serial sequence) is raised above every live or archived id, so no id is handed out
twice again.

The archive is keyed by `(operation_key, row_id)`. Ledgers the bug reached already hold archived
and live rows with equal ids; re-keying keeps every id as it was, where renumbering would cut the
link between an archived row and the row it was. The operation key names period and customer,
so two weeks' rows can never collide, and the cleanup guard (one `cleanups` row per key, ever)
archives a key's rows once, so the pair cannot repeat. A surrogate archive id plus a unique
`(operation_key, row_id)` would guarantee the same with one more column that nothing reads. The
key leads with `operation_key`, so it serves lookups by key and
`ix_digest_rows_archive_operation_key` is dropped. On PostgreSQL the archive's `row_id` loses its
unused serial default, because the value is always copied.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ARCHIVE_PK = "pk_digest_rows_archive"
ARCHIVE_KEY_INDEX = "ix_digest_rows_archive_operation_key"
HIGHEST_ROW_ID = (
    "SELECT MAX(m) FROM (SELECT COALESCE(MAX(row_id), 0) AS m FROM digest_rows"
    " UNION ALL SELECT COALESCE(MAX(row_id), 0) FROM digest_rows_archive) AS ids"
)


def upgrade() -> None:
    """Keys the archive by (operation_key, row_id) and stops `digest_rows` reusing ids."""
    bind = op.get_bind()
    with op.batch_alter_table("digest_rows_archive", recreate="auto") as batch_op:
        batch_op.drop_index(ARCHIVE_KEY_INDEX)
        batch_op.drop_constraint(ARCHIVE_PK, type_="primary")
        batch_op.create_primary_key(ARCHIVE_PK, ["operation_key", "row_id"])
        if bind.dialect.name == "postgresql":
            batch_op.alter_column("row_id", server_default=None)
    if bind.dialect.name == "postgresql":
        op.execute("DROP SEQUENCE IF EXISTS digest_rows_archive_row_id_seq")
        _raise_postgresql_sequence(bind)
    else:
        # the rebuild copies every row with its id, so nothing is renumbered
        with op.batch_alter_table(
            "digest_rows", recreate="always", table_kwargs={"sqlite_autoincrement": True}
        ):
            pass
        _raise_sqlite_sequence(bind)


def _raise_sqlite_sequence(bind: sa.Connection) -> None:
    # The copy into the AUTOINCREMENT table only records the highest *live* id; an archived
    # id above it (a week whose rows were all cleaned) must be out of reach as well.
    highest = bind.execute(sa.text(HIGHEST_ROW_ID)).scalar_one()
    seq = bind.execute(sa.text("SELECT seq FROM sqlite_sequence WHERE name = 'digest_rows'"))
    current = seq.scalar_one_or_none()
    if current is None:
        op.execute(
            sa.text(
                "INSERT INTO sqlite_sequence (name, seq) VALUES ('digest_rows', :n)"
            ).bindparams(n=highest)
        )
    elif current < highest:
        op.execute(
            sa.text("UPDATE sqlite_sequence SET seq = :n WHERE name = 'digest_rows'").bindparams(
                n=highest
            )
        )


def _raise_postgresql_sequence(bind: sa.Connection) -> None:
    # A sequence never goes back by itself; this only matters for a ledger restored or copied
    # without its sequence position, where the next id could meet an archived one.
    name = bind.execute(sa.text("SELECT pg_get_serial_sequence('digest_rows', 'row_id')"))
    # a regclass name PostgreSQL itself returns (quoted as needed), not user input
    sequence = name.scalar_one()
    last, called = bind.execute(sa.text(f"SELECT last_value, is_called FROM {sequence}")).one()
    highest = bind.execute(sa.text(HIGHEST_ROW_ID)).scalar_one()
    following = last + 1 if called else last
    if following <= highest:
        op.execute(
            sa.text("SELECT setval(CAST(:s AS regclass), :n, true)").bindparams(
                s=sequence, n=highest
            )
        )


def downgrade() -> None:
    """Restores the 0003 keys (development only).

    It fails if the archive holds one `row_id` twice, which is exactly the state 0003 cannot
    represent. `digest_rows` ids then may be reused again, as before.
    """
    bind = op.get_bind()
    with op.batch_alter_table("digest_rows_archive", recreate="auto") as batch_op:
        batch_op.drop_constraint(ARCHIVE_PK, type_="primary")
        batch_op.create_primary_key(ARCHIVE_PK, ["row_id"])
        batch_op.create_index(ARCHIVE_KEY_INDEX, ["operation_key"], unique=False)
    if bind.dialect.name == "postgresql":
        op.execute(
            "CREATE SEQUENCE digest_rows_archive_row_id_seq OWNED BY digest_rows_archive.row_id"
        )
        op.execute(
            "ALTER TABLE digest_rows_archive ALTER COLUMN row_id"
            " SET DEFAULT nextval('digest_rows_archive_row_id_seq')"
        )
        op.execute(
            "SELECT setval('digest_rows_archive_row_id_seq',"
            " COALESCE((SELECT MAX(row_id) FROM digest_rows_archive), 0) + 1, false)"
        )
    else:
        with op.batch_alter_table(
            "digest_rows", recreate="always", table_kwargs={"sqlite_autoincrement": False}
        ):
            pass
