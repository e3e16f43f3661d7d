"""Initial ledger schema: snapshots, work items, attempts, cleanups, dead letters, audit.

Revision ID: 0001
Revises: (none)
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import digest_pipeline.adapters.sql.types

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Creates every table of the first schema."""
    op.create_table(
        "audit_log",
        sa.Column(
            "audit_id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column(
            "at", digest_pipeline.adapters.sql.types.UtcDateTime(timezone=True), nullable=False
        ),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("action", sa.String(length=32), nullable=False),
        sa.Column("period", sa.String(length=8), nullable=True),
        sa.Column("operation_key", sa.String(length=160), nullable=True),
        sa.Column("from_state", sa.String(length=16), nullable=True),
        sa.Column("to_state", sa.String(length=16), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("audit_id", name=op.f("pk_audit_log")),
    )
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_audit_log_operation_key"), ["operation_key"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_audit_log_period"), ["period"], unique=False)

    op.create_table(
        "customers",
        sa.Column("customer_id", sa.String(length=128), nullable=False),
        sa.Column("email", sa.String(length=320), nullable=False),
        sa.Column("active", sa.Boolean(), nullable=False),
        sa.Column("opted_in", sa.Boolean(), nullable=False),
        sa.Column(
            "created_at",
            digest_pipeline.adapters.sql.types.UtcDateTime(timezone=True),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("customer_id", name=op.f("pk_customers")),
    )
    op.create_table(
        "dead_letters",
        sa.Column(
            "dead_letter_id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("operation_key", sa.String(length=160), nullable=False),
        sa.Column("period", sa.String(length=8), nullable=False),
        sa.Column("customer_id", sa.String(length=128), nullable=False),
        sa.Column("reason", sa.String(length=32), nullable=False),
        sa.Column("last_failure_class", sa.String(length=16), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column(
            "first_attempt_at",
            digest_pipeline.adapters.sql.types.UtcDateTime(timezone=True),
            nullable=True,
        ),
        sa.Column(
            "last_attempt_at",
            digest_pipeline.adapters.sql.types.UtcDateTime(timezone=True),
            nullable=True,
        ),
        sa.Column(
            "created_at",
            digest_pipeline.adapters.sql.types.UtcDateTime(timezone=True),
            nullable=False,
        ),
        sa.Column(
            "replayed_at",
            digest_pipeline.adapters.sql.types.UtcDateTime(timezone=True),
            nullable=True,
        ),
        sa.PrimaryKeyConstraint("dead_letter_id", name=op.f("pk_dead_letters")),
    )
    with op.batch_alter_table("dead_letters", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_dead_letters_operation_key"), ["operation_key"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_dead_letters_period"), ["period"], unique=False)

    op.create_table(
        "digest_rows",
        sa.Column(
            "row_id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("operation_key", sa.String(length=160), nullable=False),
        sa.Column("period", sa.String(length=8), nullable=False),
        sa.Column("customer_id", sa.String(length=128), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("row_id", name=op.f("pk_digest_rows")),
    )
    with op.batch_alter_table("digest_rows", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_digest_rows_operation_key"), ["operation_key"], unique=False
        )

    op.create_table(
        "digest_rows_archive",
        sa.Column(
            "row_id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("operation_key", sa.String(length=160), nullable=False),
        sa.Column("period", sa.String(length=8), nullable=False),
        sa.Column("customer_id", sa.String(length=128), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column(
            "archived_at",
            digest_pipeline.adapters.sql.types.UtcDateTime(timezone=True),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("row_id", name=op.f("pk_digest_rows_archive")),
    )
    with op.batch_alter_table("digest_rows_archive", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_digest_rows_archive_operation_key"), ["operation_key"], unique=False
        )

    op.create_table(
        "period_runs",
        sa.Column("period", sa.String(length=8), nullable=False),
        sa.Column("selection_run_id", sa.String(length=128), nullable=False),
        sa.Column(
            "selected_at",
            digest_pipeline.adapters.sql.types.UtcDateTime(timezone=True),
            nullable=False,
        ),
        sa.Column("eligible_count", sa.Integer(), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column(
            "enqueued_at",
            digest_pipeline.adapters.sql.types.UtcDateTime(timezone=True),
            nullable=True,
        ),
        sa.PrimaryKeyConstraint("period", name=op.f("pk_period_runs")),
    )
    op.create_table(
        "work_items",
        sa.Column("operation_key", sa.String(length=160), nullable=False),
        sa.Column("period", sa.String(length=8), nullable=False),
        sa.Column("customer_id", sa.String(length=128), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("budget_used", sa.Integer(), nullable=False),
        sa.Column(
            "window_started_at",
            digest_pipeline.adapters.sql.types.UtcDateTime(timezone=True),
            nullable=True,
        ),
        sa.Column(
            "first_attempt_at",
            digest_pipeline.adapters.sql.types.UtcDateTime(timezone=True),
            nullable=True,
        ),
        sa.Column(
            "last_attempt_at",
            digest_pipeline.adapters.sql.types.UtcDateTime(timezone=True),
            nullable=True,
        ),
        sa.Column(
            "next_attempt_at",
            digest_pipeline.adapters.sql.types.UtcDateTime(timezone=True),
            nullable=True,
        ),
        sa.Column("last_failure_class", sa.String(length=16), nullable=True),
        sa.Column("last_detail", sa.String(length=200), nullable=True),
        sa.Column("lease_owner", sa.String(length=128), nullable=True),
        sa.Column("lease_token", sa.Integer(), nullable=False),
        sa.Column(
            "lease_expires_at",
            digest_pipeline.adapters.sql.types.UtcDateTime(timezone=True),
            nullable=True,
        ),
        sa.Column(
            "first_claimed_at",
            digest_pipeline.adapters.sql.types.UtcDateTime(timezone=True),
            nullable=True,
        ),
        sa.Column("provider_message_id", sa.String(length=255), nullable=True),
        sa.Column(
            "created_at",
            digest_pipeline.adapters.sql.types.UtcDateTime(timezone=True),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            digest_pipeline.adapters.sql.types.UtcDateTime(timezone=True),
            nullable=False,
        ),
        sa.Column(
            "sent_at", digest_pipeline.adapters.sql.types.UtcDateTime(timezone=True), nullable=True
        ),
        sa.Column(
            "cleaned_at",
            digest_pipeline.adapters.sql.types.UtcDateTime(timezone=True),
            nullable=True,
        ),
        sa.Column(
            "replayed_at",
            digest_pipeline.adapters.sql.types.UtcDateTime(timezone=True),
            nullable=True,
        ),
        sa.Column(
            "dedupe_until",
            digest_pipeline.adapters.sql.types.UtcDateTime(timezone=True),
            nullable=True,
        ),
        sa.CheckConstraint(
            "last_failure_class IS NULL OR last_failure_class IN ('transient', 'throttled', 'permanent', 'unknown')",
            name=op.f("ck_work_items_last_failure_class"),
        ),
        sa.CheckConstraint(
            "state IN ('pending', 'claimed', 'sent', 'cleaned', 'retry_scheduled', 'unknown', 'failed', 'dead_lettered')",
            name=op.f("ck_work_items_state"),
        ),
        sa.PrimaryKeyConstraint("operation_key", name=op.f("pk_work_items")),
        sa.UniqueConstraint("period", "customer_id", name=op.f("uq_work_items_period_customer_id")),
    )
    with op.batch_alter_table("work_items", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_work_items_period_state"), ["period", "state"], unique=False
        )
        batch_op.create_index(
            batch_op.f("ix_work_items_state_next_attempt_at"),
            ["state", "next_attempt_at"],
            unique=False,
        )

    op.create_table(
        "attempts",
        sa.Column(
            "attempt_id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("operation_key", sa.String(length=160), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("lease_token", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(length=128), nullable=False),
        sa.Column(
            "started_at",
            digest_pipeline.adapters.sql.types.UtcDateTime(timezone=True),
            nullable=False,
        ),
        sa.Column(
            "finished_at",
            digest_pipeline.adapters.sql.types.UtcDateTime(timezone=True),
            nullable=True,
        ),
        sa.Column("outcome", sa.String(length=16), nullable=True),
        sa.Column("detail", sa.String(length=200), nullable=True),
        sa.Column("provider_message_id", sa.String(length=255), nullable=True),
        sa.Column("duplicate", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["operation_key"],
            ["work_items.operation_key"],
            name=op.f("fk_attempts_operation_key_work_items"),
        ),
        sa.PrimaryKeyConstraint("attempt_id", name=op.f("pk_attempts")),
        sa.UniqueConstraint(
            "operation_key", "number", name=op.f("uq_attempts_operation_key_number")
        ),
    )
    op.create_table(
        "cleanups",
        sa.Column("operation_key", sa.String(length=160), nullable=False),
        sa.Column("period", sa.String(length=8), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("rows", sa.Integer(), nullable=False),
        sa.Column(
            "claimed_at",
            digest_pipeline.adapters.sql.types.UtcDateTime(timezone=True),
            nullable=False,
        ),
        sa.Column(
            "completed_at",
            digest_pipeline.adapters.sql.types.UtcDateTime(timezone=True),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["operation_key"],
            ["work_items.operation_key"],
            name=op.f("fk_cleanups_operation_key_work_items"),
        ),
        sa.PrimaryKeyConstraint("operation_key", name=op.f("pk_cleanups")),
    )
    with op.batch_alter_table("cleanups", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_cleanups_period"), ["period"], unique=False)

    op.create_table(
        "eligibility_snapshot",
        sa.Column("period", sa.String(length=8), nullable=False),
        sa.Column("customer_id", sa.String(length=128), nullable=False),
        sa.Column("recipient", sa.String(length=320), nullable=False),
        sa.ForeignKeyConstraint(
            ["period"],
            ["period_runs.period"],
            name=op.f("fk_eligibility_snapshot_period_period_runs"),
        ),
        sa.PrimaryKeyConstraint("period", "customer_id", name=op.f("pk_eligibility_snapshot")),
    )


def downgrade() -> None:
    """Drops them again (development only: it loses the ledger)."""
    op.drop_table("eligibility_snapshot")
    with op.batch_alter_table("cleanups", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_cleanups_period"))

    op.drop_table("cleanups")
    op.drop_table("attempts")
    with op.batch_alter_table("work_items", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_work_items_state_next_attempt_at"))
        batch_op.drop_index(batch_op.f("ix_work_items_period_state"))

    op.drop_table("work_items")
    op.drop_table("period_runs")
    with op.batch_alter_table("digest_rows_archive", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_digest_rows_archive_operation_key"))

    op.drop_table("digest_rows_archive")
    with op.batch_alter_table("digest_rows", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_digest_rows_operation_key"))

    op.drop_table("digest_rows")
    with op.batch_alter_table("dead_letters", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_dead_letters_period"))
        batch_op.drop_index(batch_op.f("ix_dead_letters_operation_key"))

    op.drop_table("dead_letters")
    op.drop_table("customers")
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_audit_log_period"))
        batch_op.drop_index(batch_op.f("ix_audit_log_operation_key"))

    op.drop_table("audit_log")
