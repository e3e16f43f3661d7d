"""A partial index of the due work items in claim order, so a claim never sorts the period.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Literal on purpose: the schema module's CLAIMABLE_SQL may change later; this revision may not.
DUE = "state IN ('pending', 'retry_scheduled')"


def upgrade() -> None:
    """Creates `ix_work_items_due` on (period, next_attempt_at, operation_key) of claimable items."""
    op.create_index(
        "ix_work_items_due",
        "work_items",
        ["period", "next_attempt_at", "operation_key"],
        unique=False,
        postgresql_where=sa.text(DUE),
        sqlite_where=sa.text(DUE),
    )


def downgrade() -> None:
    """Drops it again."""
    op.drop_index("ix_work_items_due", table_name="work_items")
