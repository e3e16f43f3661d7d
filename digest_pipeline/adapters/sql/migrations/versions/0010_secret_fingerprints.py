"""The ledger records a keyed fingerprint of the unsubscribe secret, so no process signs with another.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-07

`secret_fingerprints` holds one row per purpose: an HMAC keyed with the secret over a fixed label
(never the secret itself), when it was recorded, and after a rotation the previous fingerprint
with the end of its overlap. The row is written by the first process that signs or
checks links (domain/fingerprints.py), so a ledger upgraded to this revision starts with none.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from digest_pipeline.adapters.sql.types import UtcDateTime

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Creates `secret_fingerprints`."""
    op.create_table(
        "secret_fingerprints",
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("recorded_at", UtcDateTime(timezone=True), nullable=False),
        sa.Column("previous_fingerprint", sa.String(64), nullable=True),
        sa.Column("previous_until", UtcDateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "(previous_fingerprint IS NULL) = (previous_until IS NULL)",
            name=op.f("ck_secret_fingerprints_previous"),
        ),
        sa.PrimaryKeyConstraint("purpose", name=op.f("pk_secret_fingerprints")),
    )


def downgrade() -> None:
    """Drops `secret_fingerprints`."""
    op.drop_table("secret_fingerprints")
