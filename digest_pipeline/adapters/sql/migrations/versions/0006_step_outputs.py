"""Step outputs in the ledger: the values Dagster steps pass on, readable from any machine.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02

With steps on Celery workers or Kubernetes pods, Dagster's default filesystem I/O manager left
the delivery fan-out's outputs on the disk of whichever process wrote them, and the next step,
elsewhere, could not read them. They are a few small JSON values per run; the ledger database is
the one store every step already reaches.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from digest_pipeline.adapters.sql.types import UtcDateTime

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Creates `step_outputs`."""
    op.create_table(
        "step_outputs",
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("step_key", sa.String(255), nullable=False),
        sa.Column("output_name", sa.String(255), nullable=False),
        sa.Column("mapping_key", sa.String(255), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("created_at", UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint(
            "run_id", "step_key", "output_name", "mapping_key", name=op.f("pk_step_outputs")
        ),
    )
    op.create_index(
        op.f("ix_step_outputs_created_at"), "step_outputs", ["created_at"], unique=False
    )


def downgrade() -> None:
    """Drops `step_outputs`."""
    op.drop_index(op.f("ix_step_outputs_created_at"), table_name="step_outputs")
    op.drop_table("step_outputs")
