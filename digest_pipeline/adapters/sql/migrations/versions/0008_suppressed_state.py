"""A work item may end `suppressed`: its customer left the list of people we may mail.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03

A customer suppressed after their week's snapshot froze (one-click unsubscribe, hard bounce,
complaint, operator) keeps their frozen entry, and their never-claimed item ends in the new
terminal state `suppressed` instead of being sent. Only the state's CHECK constraint changes; on
SQLite the table is rebuilt with every row, index and other constraint as it was, in the
migration's transaction.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Literal on purpose: the domain's enum may grow later; this revision may not change.
BEFORE = (
    "state IN ('pending', 'claimed', 'sent', 'cleaned', 'retry_scheduled', 'unknown', "
    "'failed', 'dead_lettered')"
)
AFTER = (
    "state IN ('pending', 'claimed', 'sent', 'cleaned', 'retry_scheduled', 'unknown', "
    "'failed', 'dead_lettered', 'suppressed')"
)
NAME = "ck_work_items_state"


def _replace_check(condition: str) -> None:
    # `attempts` and `cleanups` reference the table the rebuild drops: `migrate` runs with
    # SQLite's foreign keys off and checks them all before it commits
    with op.batch_alter_table("work_items", recreate="auto") as batch_op:
        batch_op.drop_constraint(op.f(NAME), type_="check")
        batch_op.create_check_constraint(op.f(NAME), condition)


def upgrade() -> None:
    """Allows `suppressed` in `work_items.state`."""
    _replace_check(AFTER)


def downgrade() -> None:
    """Forbids it again (fails while any item is `suppressed`)."""
    _replace_check(BEFORE)
