"""Customer and provider feedback: the suppression list, provider events and the demo marker.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03

`digest serve` records one-click unsubscribes and the provider's webhook events:
`suppressions` holds one row per suppressed customer id (never an address), `provider_events`
one row per (provider, event id) with its matched operation key and what it did. A provider
event names its message by the provider's id, so `attempts.provider_message_id` gets an index.
`demo_seed` is written by `digest seed`: the public demo unsubscribe secret is accepted only on
a ledger that has it.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from digest_pipeline.adapters.sql.types import UtcDateTime

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Literal on purpose: the domain's enums may grow later; this revision may not change.
REASONS = "reason IN ('unsubscribed', 'hard_bounce', 'complaint', 'operator')"
TYPES = "type IN ('delivered', 'hard_bounce', 'soft_bounce', 'complaint', 'other')"
OUTCOMES = (
    "outcome IN ('received', 'settled_sent', 'confirmed', 'not_settled', 'suppressed', "
    "'already_suppressed', 'recorded', 'unmatched')"
)


def upgrade() -> None:
    """Creates `suppressions`, `provider_events` and `demo_seed`; indexes attempts by message id."""
    op.create_table(
        "suppressions",
        sa.Column("customer_id", sa.String(128), nullable=False),
        sa.Column("reason", sa.String(16), nullable=False),
        sa.Column("source", sa.String(200), nullable=False),
        sa.Column("created_at", UtcDateTime(timezone=True), nullable=False),
        sa.CheckConstraint(REASONS, name=op.f("ck_suppressions_reason")),
        sa.PrimaryKeyConstraint("customer_id", name=op.f("pk_suppressions")),
    )
    op.create_index(
        op.f("ix_suppressions_created_at"), "suppressions", ["created_at"], unique=False
    )
    op.create_table(
        "provider_events",
        sa.Column("provider", sa.String(32), nullable=False),
        sa.Column("event_id", sa.String(128), nullable=False),
        sa.Column("type", sa.String(16), nullable=False),
        sa.Column("operation_key", sa.String(160), nullable=True),
        sa.Column("provider_message_id", sa.String(255), nullable=True),
        sa.Column("received_at", UtcDateTime(timezone=True), nullable=False),
        sa.Column("outcome", sa.String(24), nullable=False),
        sa.CheckConstraint(TYPES, name=op.f("ck_provider_events_type")),
        sa.CheckConstraint(OUTCOMES, name=op.f("ck_provider_events_outcome")),
        sa.PrimaryKeyConstraint("provider", "event_id", name=op.f("pk_provider_events")),
    )
    op.create_index(
        op.f("ix_provider_events_operation_key"),
        "provider_events",
        ["operation_key"],
        unique=False,
    )
    op.create_index(
        op.f("ix_provider_events_received_at"), "provider_events", ["received_at"], unique=False
    )
    op.create_table(
        "demo_seed",
        sa.Column("singleton", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("seeded_at", UtcDateTime(timezone=True), nullable=False),
        sa.CheckConstraint("singleton = 1", name=op.f("ck_demo_seed_singleton")),
        sa.PrimaryKeyConstraint("singleton", name=op.f("pk_demo_seed")),
    )
    op.create_index(
        "ix_attempts_provider_message_id", "attempts", ["provider_message_id"], unique=False
    )


def downgrade() -> None:
    """Drops them again."""
    op.drop_index("ix_attempts_provider_message_id", table_name="attempts")
    op.drop_table("demo_seed")
    op.drop_index(op.f("ix_provider_events_received_at"), table_name="provider_events")
    op.drop_index(op.f("ix_provider_events_operation_key"), table_name="provider_events")
    op.drop_table("provider_events")
    op.drop_index(op.f("ix_suppressions_created_at"), table_name="suppressions")
    op.drop_table("suppressions")
