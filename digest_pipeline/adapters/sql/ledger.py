"""The SQL ledger: the source of truth for work items, on SQLite or PostgreSQL (SQLAlchemy Core).

Every state change is one guarded `UPDATE … WHERE operation_key = :k AND state = :expected AND
lease_token = :token`; zero rows raise LostRace. Claims use `FOR UPDATE SKIP LOCKED` on
PostgreSQL and a serialized `BEGIN IMMEDIATE` transaction on SQLite.
"""

from digest_pipeline.adapters.sql.cleanup import SqlCleaner
from digest_pipeline.adapters.sql.content import SqlContent
from digest_pipeline.adapters.sql.measurements import SqlMeasurements
from digest_pipeline.adapters.sql.read_model import SqlReadModel
from digest_pipeline.adapters.sql.snapshots import SqlSnapshots
from digest_pipeline.adapters.sql.suppressions import SqlSuppressions
from digest_pipeline.ports import Ledger


class SqlLedger(
    SqlSnapshots, SqlContent, SqlSuppressions, SqlCleaner, SqlReadModel, SqlMeasurements, Ledger
):
    """The `Ledger` port over an SQLAlchemy engine (schema from `engine.migrate`)."""
