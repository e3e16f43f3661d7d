"""The SQL ledger: the source of truth for work items, on SQLite or PostgreSQL (SQLAlchemy Core).

Every state change is one guarded `UPDATE … WHERE operation_key = :k AND state = :expected AND
lease_token = :token`; zero rows raise LostRace. Claims use `FOR UPDATE SKIP LOCKED` on
PostgreSQL and a serialized `BEGIN IMMEDIATE` transaction on SQLite.
"""

from collections.abc import Callable
from functools import partial

from digest_pipeline.adapters.sql.cleanup import SqlCleaner
from digest_pipeline.adapters.sql.content import SqlContent
from digest_pipeline.adapters.sql.engine import create_ledger_engine, head_revision, schema_revision
from digest_pipeline.adapters.sql.fingerprints import SqlSecretFingerprints
from digest_pipeline.adapters.sql.identity import recorded_instance, shown_url, stored_ledger_id
from digest_pipeline.adapters.sql.measurements import SqlMeasurements
from digest_pipeline.adapters.sql.pacing import SqlSendBudget
from digest_pipeline.adapters.sql.read_model import SqlReadModel
from digest_pipeline.adapters.sql.snapshots import SqlSnapshots
from digest_pipeline.adapters.sql.suppressions import SqlSuppressions
from digest_pipeline.domain.errors import LedgerMismatch
from digest_pipeline.domain.periods import DEFAULT_INSTANCE
from digest_pipeline.ports import Ledger, SecretFingerprints, SendBudget


class SqlLedger(
    SqlSnapshots, SqlContent, SqlSuppressions, SqlCleaner, SqlReadModel, SqlMeasurements, Ledger
):
    """The `Ledger` port over an SQLAlchemy engine (schema from `engine.migrate`).

    `SqlLedger(engine, instance)` makes the keys of digest instance `instance` (`digest` by
    default); `wiring.ledger_on` also records or checks that name in the ledger.
    """

    @property
    def secret_fingerprints(self) -> SecretFingerprints:
        return SqlSecretFingerprints(self._engine)

    @property
    def send_budget(self) -> SendBudget:
        return SqlSendBudget(self._engine)

    def recipe(self) -> "Callable[[], Ledger] | None":
        # SQLite's work is this process's CPU and its writers take turns on one file lock: a
        # second process would only wait for it. A ledger with no id yet (never opened by a
        # run) could not be told from another: no helper opens it.
        if not self._pg or (found := stored_ledger_id(self._engine)) is None:
            return None
        url = self._engine.url.render_as_string(False)
        return partial(open_same_ledger, url, found, self._instance)


def open_same_ledger(url: str, expected_id: str, instance: str = DEFAULT_INSTANCE) -> SqlLedger:
    """The ledger at `url` in another process; LedgerMismatch unless it is the one expected.

    A helper process opens the run's ledger by its URL. The database there must carry the
    ledger id the run's process read, be at the schema revision this code was written for (the
    run's process migrated it) and belong to no other digest instance than the run's (the run's
    process recorded or checked it): a helper never migrates, never records an instance and
    never works on another database that happens to answer at the same address.
    """
    engine = create_ledger_engine(url, create=False)
    try:
        found = stored_ledger_id(engine)
        if found != expected_id:
            raise LedgerMismatch(
                f"the ledger at {shown_url(url)} is not the run's (ledger id {found}, "
                f"expected {expected_id})"
            )
        if schema_revision(engine) != head_revision():
            raise LedgerMismatch(
                f"the ledger at {shown_url(url)} is not at schema revision {head_revision()}"
            )
        # an empty ledger that names no instance holds no one's keys: nothing to mix up
        if (recorded := recorded_instance(engine)) not in (None, instance):
            raise LedgerMismatch(
                f"the ledger at {shown_url(url)} is not the run's (digest instance {recorded}, "
                f"expected {instance})"
            )
    except BaseException:
        engine.dispose()
        raise
    return SqlLedger(engine, instance)
