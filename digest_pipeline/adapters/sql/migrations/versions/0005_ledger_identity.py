"""The ledger's identity: one row holding a random id, so every step can check its ledger.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

A Dagster run records the id of the ledger its first step opened; a later step (another process,
another machine) that resolves a different database, or an empty SQLite file in its working
directory, refuses instead of running against it. The row itself is written by the adapter on
first use (`sql_identity.ledger_id`), so a truncated test database gets a new identity too.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from digest_pipeline.adapters.sql.types import UtcDateTime

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Creates `ledger_identity` (at most one row)."""
    op.create_table(
        "ledger_identity",
        sa.Column("singleton", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("ledger_id", sa.String(36), nullable=False),
        sa.Column("created_at", UtcDateTime(timezone=True), nullable=False),
        sa.CheckConstraint("singleton = 1", name=op.f("ck_ledger_identity_singleton")),
        sa.PrimaryKeyConstraint("singleton", name=op.f("pk_ledger_identity")),
    )


def downgrade() -> None:
    """Drops `ledger_identity`."""
    op.drop_table("ledger_identity")
