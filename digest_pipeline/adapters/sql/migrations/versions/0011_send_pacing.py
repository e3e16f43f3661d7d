"""The ledger keeps the install's send slots and pause, so every sender shares one pace.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06

`send_pacing` holds one row per mailer identity: the next free send slot and, after a provider's
rate limit or quota answer, the pause every sender honours (domain/pacing.py). Times are integer
microseconds since the epoch, so that one `UPDATE` takes a slot on SQLite and PostgreSQL alike.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Creates `send_pacing`."""
    op.create_table(
        "send_pacing",
        sa.Column("mailer", sa.String(64), nullable=False),
        sa.Column("next_slot_us", sa.BigInteger(), nullable=False),
        sa.Column("paused_until_us", sa.BigInteger(), nullable=True),
        sa.Column("paused_why", sa.String(200), nullable=True),
        sa.CheckConstraint(
            "(paused_until_us IS NULL) = (paused_why IS NULL)", name=op.f("ck_send_pacing_pause")
        ),
        sa.PrimaryKeyConstraint("mailer", name=op.f("pk_send_pacing")),
    )


def downgrade() -> None:
    """Drops `send_pacing`."""
    op.drop_table("send_pacing")
