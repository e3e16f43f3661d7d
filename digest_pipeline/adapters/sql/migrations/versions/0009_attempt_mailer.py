"""Each attempt records the mailer that made it, so evidence about it comes only from that mailer.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06

`attempts.mailer` holds the mailer's kind and a non-secret digest of its endpoint or account
(`outbox:…`, `smtp:…`, `http:…`). Attempts recorded before this revision keep NULL: an unknown
identity counts as "some other mailer", so no mailer's lookup or idempotent resend settles them;
only an operator's `digest resolve` does.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Adds the nullable `attempts.mailer`."""
    with op.batch_alter_table("attempts") as batch_op:
        batch_op.add_column(sa.Column("mailer", sa.String(64), nullable=True))


def downgrade() -> None:
    """Drops `attempts.mailer`."""
    with op.batch_alter_table("attempts") as batch_op:
        batch_op.drop_column("mailer")
