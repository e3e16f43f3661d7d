"""The ledger's tables (SQLAlchemy Core), one schema for SQLite and PostgreSQL.

The migrations under `migrations/` create exactly this schema; a test compares the two. The
`customers`, `products` and `orders` tables are the shop's source data in the embedded setup, the
rest is the ledger.

State moves allowed on `work_items.state` (mirrors domain/states.py):
    -- pending -> claimed -> sent -> cleaned
    -- claimed -> retry_scheduled -> claimed          (also: expired lease, no attempt open)
    -- claimed -> unknown -> sent | retry_scheduled | dead_lettered
    -- claimed -> failed | dead_lettered
    -- retry_scheduled -> dead_lettered
    -- dead_lettered | failed -> pending              (replay only)
"""

from collections.abc import Iterable
from enum import Enum

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)

from digest_pipeline.adapters.sql.types import UtcDateTime
from digest_pipeline.domain.failures import FailureClass
from digest_pipeline.domain.feedback import EventOutcome, EventType, SuppressionReason
from digest_pipeline.domain.states import CLAIMABLE, DeliveryState

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

# SQLite only auto-increments an INTEGER PRIMARY KEY, not BIGINT.
Id = BigInteger().with_variant(Integer(), "sqlite")


def sql_literals(members: Iterable[Enum]) -> str:
    """`'a', 'b'`: the members' values as SQL string literals, in the order given.

    For CHECK constraints and `IN (…)` lists; a set's members are passed sorted, so the text
    (which a partial index's predicate is matched by) is the same in every process.
    """
    return ", ".join(f"'{m.value}'" for m in members)


STATES = sql_literals(DeliveryState)
#: the states `claim_due` hands out, as literal SQL: queries repeat it verbatim so that the
#: planners (PostgreSQL's generic plans included) can match the partial index `ix_work_items_due`
CLAIMABLE_SQL = f"state IN ({sql_literals(sorted(CLAIMABLE))})"
FAILURE_CLASSES = sql_literals(FailureClass)

customers = Table(
    "customers",
    metadata,
    Column("customer_id", String(128), primary_key=True),
    Column("email", String(320), nullable=False),
    Column("active", Boolean, nullable=False),
    Column("opted_in", Boolean, nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
)

# The catalogue and the order lines the digest content is picked from (domain/catalogue.py).
# No foreign keys: like `customers`, these mirror the shop's data, which may arrive in any order.
products = Table(
    "products",
    metadata,
    Column("product_id", String(64), primary_key=True),
    Column("title", String(300), nullable=False),
    Column("category", String(64), nullable=False),
    Column("price_cents", Integer, nullable=False),
    Column("currency", String(3), nullable=False),
    Column("url", String(500), nullable=False),
    Column("image_url", String(500)),
    Column("created_at", UtcDateTime, nullable=False),
)

orders = Table(
    "orders",
    metadata,
    Column("order_id", String(64), primary_key=True),
    Column("customer_id", String(128), nullable=False, index=True),
    Column("product_id", String(64), nullable=False),
    Column("ordered_at", UtcDateTime, nullable=False, index=True),
)

period_runs = Table(
    "period_runs",
    metadata,
    Column("period", String(8), primary_key=True),
    Column("selection_run_id", String(128), nullable=False),
    Column("selected_at", UtcDateTime, nullable=False),
    Column("eligible_count", Integer, nullable=False),
    Column("fingerprint", String(64), nullable=False),
    Column("enqueued_at", UtcDateTime),
)

eligibility_snapshot = Table(
    "eligibility_snapshot",
    metadata,
    Column("period", String(8), ForeignKey("period_runs.period"), primary_key=True),
    Column("customer_id", String(128), primary_key=True),
    Column("recipient", String(320), nullable=False),
)

work_items = Table(
    "work_items",
    metadata,
    Column("operation_key", String(160), primary_key=True),
    Column("period", String(8), nullable=False),
    Column("customer_id", String(128), nullable=False),
    Column("state", String(16), nullable=False),
    Column("attempts", Integer, nullable=False, default=0),
    Column("budget_used", Integer, nullable=False, default=0),
    Column("window_started_at", UtcDateTime),
    Column("first_attempt_at", UtcDateTime),
    Column("last_attempt_at", UtcDateTime),
    Column("next_attempt_at", UtcDateTime),
    Column("last_failure_class", String(16)),
    Column("last_detail", String(200)),
    Column("lease_owner", String(128)),
    Column("lease_token", Integer, nullable=False, default=0),
    Column("lease_expires_at", UtcDateTime),
    Column("first_claimed_at", UtcDateTime),
    Column("provider_message_id", String(255)),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    Column("sent_at", UtcDateTime),
    Column("cleaned_at", UtcDateTime),
    Column("replayed_at", UtcDateTime),
    Column("dedupe_until", UtcDateTime),
    UniqueConstraint("period", "customer_id"),
    CheckConstraint(f"state IN ({STATES})", name="state"),
    CheckConstraint(
        f"last_failure_class IS NULL OR last_failure_class IN ({FAILURE_CLASSES})",
        name="last_failure_class",
    ),
    Index(None, "state", "next_attempt_at"),
    Index(None, "period", "state"),
    # A period's due items, oldest first, already in claim order: a claim reads its LIMIT rows
    # off this index instead of sorting every due item of a 100,000-item period.
    Index(
        "ix_work_items_due",
        "period",
        "next_attempt_at",
        "operation_key",
        postgresql_where=text(CLAIMABLE_SQL),
        sqlite_where=text(CLAIMABLE_SQL),
    ),
)

attempts = Table(
    "attempts",
    metadata,
    Column("attempt_id", Id, primary_key=True, autoincrement=True),
    Column("operation_key", String(160), ForeignKey("work_items.operation_key"), nullable=False),
    Column("number", Integer, nullable=False),
    Column("lease_token", Integer, nullable=False),
    Column("worker", String(128), nullable=False),
    Column("started_at", UtcDateTime, nullable=False),
    Column("finished_at", UtcDateTime),
    # `sent` or a failure class; NULL while the attempt is open
    Column("outcome", String(16)),
    Column("detail", String(200)),
    Column("provider_message_id", String(255)),
    Column("duplicate", Boolean, nullable=False, default=False),
    # the mailer that made the attempt (`Mailer.identity`); NULL: recorded before it was kept
    Column("mailer", String(64)),
    UniqueConstraint("operation_key", "number"),
)

cleanups = Table(
    "cleanups",
    metadata,
    # the primary key is the guard: at most one cleanup per operation key, ever
    Column("operation_key", String(160), ForeignKey("work_items.operation_key"), primary_key=True),
    Column("period", String(8), nullable=False, index=True),
    Column("mode", String(16), nullable=False),
    Column("rows", Integer, nullable=False),
    Column("claimed_at", UtcDateTime, nullable=False),
    Column("completed_at", UtcDateTime, nullable=False),
)


def _digest_row_columns(*, archived: bool) -> list[Column[object]]:
    return [
        Column("row_id", Id, primary_key=not archived, autoincrement=not archived, nullable=False),
        Column("operation_key", String(160), nullable=False, index=not archived),
        Column("period", String(8), nullable=False),
        Column("customer_id", String(128), nullable=False),
        Column("position", Integer, nullable=False),
        Column("payload", JSON, nullable=False),
    ]


# AUTOINCREMENT because without it SQLite hands the ids of cleaned (deleted) rows to the next
# week's rows; with it an id names one row ever, live or archived (migration 0004).
digest_rows = Table(
    "digest_rows", metadata, *_digest_row_columns(archived=False), sqlite_autoincrement=True
)
digest_rows_archive = Table(
    "digest_rows_archive",
    metadata,
    *_digest_row_columns(archived=True),
    Column("archived_at", UtcDateTime, nullable=False),
    # `row_id` is the live row's id, copied; ledgers from before 0004 reused ids across weeks,
    # and the key (whose rows are archived once, by the cleanup guard) keeps those apart
    PrimaryKeyConstraint("operation_key", "row_id"),
)

dead_letters = Table(
    "dead_letters",
    metadata,
    Column("dead_letter_id", Id, primary_key=True, autoincrement=True),
    Column("operation_key", String(160), nullable=False, index=True),
    Column("period", String(8), nullable=False, index=True),
    Column("customer_id", String(128), nullable=False),
    Column("reason", String(32), nullable=False),
    Column("last_failure_class", String(16)),
    Column("attempts", Integer, nullable=False),
    Column("first_attempt_at", UtcDateTime),
    Column("last_attempt_at", UtcDateTime),
    Column("created_at", UtcDateTime, nullable=False),
    Column("replayed_at", UtcDateTime),
)

audit_log = Table(
    "audit_log",
    metadata,
    Column("audit_id", Id, primary_key=True, autoincrement=True),
    Column("at", UtcDateTime, nullable=False),
    Column("actor", String(128), nullable=False),
    Column("action", String(32), nullable=False),
    Column("period", String(8), index=True),
    Column("operation_key", String(160), index=True),
    Column("from_state", String(16)),
    Column("to_state", String(16)),
    Column("reason", Text, nullable=False),
)

#: one row: the ledger's own identity, so a process can tell it opened the run's ledger and
#: not an empty one that happens to answer on the same kind of URL (see defs/run_ledger.py)
ledger_identity = Table(
    "ledger_identity",
    metadata,
    Column("singleton", Integer, primary_key=True, autoincrement=False),
    Column("ledger_id", String(36), nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    #: the digest instance whose keys the ledger holds (`identity.claim_instance`); NULL on a
    #: ledger made before instances, which is `digest`'s once it holds work
    Column("instance", String(32), nullable=True),
    CheckConstraint("singleton = 1", name="singleton"),
)

#: the small values Dagster steps hand each other (the delivery fan-out's batch numbers and
#: counts), so a step on another machine never reads the launcher's disk (defs/io_manager.py);
#: a re-execution reads its parent run's rows, so they are kept for a while (`created_at`)
step_outputs = Table(
    "step_outputs",
    metadata,
    Column("run_id", String(64), nullable=False),
    Column("step_key", String(255), nullable=False),
    Column("output_name", String(255), nullable=False),
    Column("mapping_key", String(255), nullable=False),
    Column("value", Text, nullable=False),
    Column("created_at", UtcDateTime, nullable=False, index=True),
    PrimaryKeyConstraint("run_id", "step_key", "output_name", "mapping_key"),
)

# -- customer and provider feedback (`digest serve`; migration 0007) --------------------------

#: the reasons a customer is suppressed (domain/feedback.py `SuppressionReason`)
SUPPRESSION_REASONS = sql_literals(SuppressionReason)
EVENT_TYPES = sql_literals(EventType)
EVENT_OUTCOMES = sql_literals(EventOutcome)

#: one row per suppressed customer (the first reason wins); by id only, never an address
suppressions = Table(
    "suppressions",
    metadata,
    Column("customer_id", String(128), primary_key=True),
    Column("reason", String(16), nullable=False),
    Column("source", String(200), nullable=False),
    Column("created_at", UtcDateTime, nullable=False, index=True),
    CheckConstraint(f"reason IN ({SUPPRESSION_REASONS})", name="reason"),
)

#: every provider webhook event, once per (provider, event id): what it was and what it did
provider_events = Table(
    "provider_events",
    metadata,
    Column("provider", String(32), nullable=False),
    Column("event_id", String(128), nullable=False),
    Column("type", String(16), nullable=False),
    Column("operation_key", String(160), index=True),
    Column("provider_message_id", String(255)),
    Column("received_at", UtcDateTime, nullable=False, index=True),
    Column("outcome", String(24), nullable=False),
    PrimaryKeyConstraint("provider", "event_id"),
    CheckConstraint(f"type IN ({EVENT_TYPES})", name="type"),
    CheckConstraint(f"outcome IN ({EVENT_OUTCOMES})", name="outcome"),
)

#: one row once `digest seed` wrote demo data here: the public demo unsubscribe secret is
#: allowed only on such a ledger (domain/unsubscribe.py)
demo_seed = Table(
    "demo_seed",
    metadata,
    Column("singleton", Integer, primary_key=True, autoincrement=False),
    Column("seeded_at", UtcDateTime, nullable=False),
    CheckConstraint("singleton = 1", name="singleton"),
)

#: one row per purpose: the keyed fingerprint of the secret that signs what customers hold
#: (never the secret), and after a rotation the previous one until its overlap ends (migration
#: 0010, domain/fingerprints.py)
secret_fingerprints = Table(
    "secret_fingerprints",
    metadata,
    Column("purpose", String(32), primary_key=True),
    Column("fingerprint", String(64), nullable=False),
    Column("recorded_at", UtcDateTime, nullable=False),
    Column("previous_fingerprint", String(64)),
    Column("previous_until", UtcDateTime),
    CheckConstraint("(previous_fingerprint IS NULL) = (previous_until IS NULL)", name="previous"),
)

#: one row per mailer identity: the install's next send slot and its pause (migration 0011,
#: domain/pacing.py). Times are integer microseconds since the epoch, so that one `UPDATE`
#: computes the next slot on both SQLite and PostgreSQL without date arithmetic in SQL.
send_pacing = Table(
    "send_pacing",
    metadata,
    Column("mailer", String(64), primary_key=True),
    Column("next_slot_us", BigInteger, nullable=False),
    Column("paused_until_us", BigInteger),
    Column("paused_why", String(200)),
    CheckConstraint("(paused_until_us IS NULL) = (paused_why IS NULL)", name="pause"),
)

#: a provider event names its message by the provider's id: find the attempt without a scan
Index("ix_attempts_provider_message_id", attempts.c.provider_message_id)
