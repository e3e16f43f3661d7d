"""The aggregate `Ledger`: every role port over one database, for the adapters and the composition root.

Services name the roles they use (`ledger_roles`), never this aggregate; an import-linter
contract holds them to it.
"""

from collections.abc import Iterator

from digest_pipeline.domain.chunks import chunked
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.states import DELIVERED
from digest_pipeline.ports.ledger_roles import (
    AuditTrail,
    Cleaner,
    ContentBacklog,
    ContentStore,
    HasSecretFingerprints,
    HasSendBudget,
    ReadModel,
    SendBudget,
    SnapshotStore,
    SuppressionList,
    WorkQueue,
)


class Ledger(
    SnapshotStore,
    ContentStore,
    WorkQueue,
    Cleaner,
    ReadModel,
    AuditTrail,
    SuppressionList,
    ContentBacklog,
    HasSecretFingerprints,
    HasSendBudget,
):
    """The source of truth: every role port, over one database (design §5).

    The adapters implement it whole and the composition root hands it out; a service names only
    the roles it uses. Implementations must be safe to call from many threads.
    """

    @property
    def send_budget(self) -> SendBudget | None:
        """The install's send slots and pause in this ledger; None: unpaced, no shared pause."""
        return None

    def iter_needing_content(self, period: Period, page: int = 5_000) -> Iterator[str]:
        """The frozen customer ids, in order, that content generation must write rows for.

        Those with no live rows whose item is neither sent nor cleaned (or who have no item
        yet). Streamed a page at a time, each page read once the caller is done with the one
        before; the SQL ledger answers a page in one statement, this default in three.
        """
        entries = self.iter_snapshot_entries(period, page=page)
        for chunk in chunked(entries, page):
            keys = [OperationKey(period, e.customer_id, self.instance) for e in chunk]
            has_rows = self.keys_with_rows_of(keys)
            fresh = [k for k in keys if k not in has_rows]
            done = {k for k, item in self.items_of(fresh).items() if item.state in DELIVERED}
            yield from (k.customer_id for k in fresh if k not in done)
