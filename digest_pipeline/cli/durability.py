"""Fail closed on a ledger that can lose commits: `digest run`, `sweep` and `serve` check it here.

A PostgreSQL ledger with `fsync` or `synchronous_commit` off can forget, in a crash, the
"attempt started" rows it had committed, and a restart then sends those digests again. Each of
these commands asks the ledger's own connection first and stops with one line (exit 2), having
recorded nothing, unless `DIGEST_ALLOW_NONDURABLE_LEDGER` declares the ledger a throwaway. The
Dagster steps ask the same (`component/guards.py`), so a UI, schedule or sensor run fails closed too.
"""

from digest_pipeline.adapters.sql.durability import read_durability
from digest_pipeline.cli.context import Context, UsageError
from digest_pipeline.domain.durability import durability_refusal


class NondurableLedgerRefused(UsageError):
    """The ledger's database can lose commits and no setting declares it a throwaway."""


def require_durable_ledger(ctx: Context, what: str) -> None:
    """Raises NondurableLedgerRefused unless the ledger keeps its commits (or may not)."""
    refusal = durability_refusal(
        read_durability(ctx.engine), allowed=ctx.settings.allow_nondurable_ledger, what=what
    )
    if refusal is not None:
        raise NondurableLedgerRefused(refusal)
