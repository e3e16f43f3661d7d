"""The ledger records the digest instance whose operation keys it holds.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07

`ledger_identity.instance` is written by the adapter when a process first opens the ledger under
an instance's name (`identity.claim_instance`); a process configured with another name refuses.
Ledgers made before this revision keep NULL: one that already holds work is the default
instance's (`digest`, the only keys it can hold), an empty one takes the first name it is opened
with.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Adds the nullable `ledger_identity.instance`."""
    with op.batch_alter_table("ledger_identity") as batch_op:
        batch_op.add_column(sa.Column("instance", sa.String(32), nullable=True))


def downgrade() -> None:
    """Drops `ledger_identity.instance`."""
    with op.batch_alter_table("ledger_identity") as batch_op:
        batch_op.drop_column("instance")
