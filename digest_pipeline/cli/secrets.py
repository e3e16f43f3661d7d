"""Fail closed on the public demo secret: `digest run`, `sweep` and `serve` check it here first.

`DIGEST_UNSUBSCRIBE_SECRET` defaults to a value printed in this repository. It may sign and check
links only on a ledger `digest seed` filled with demo data; on any other ledger the command
stops with one line (exit 2) before it sends or listens. The Dagster delivery step asks the same
(`defs/guards.py`), so a run launched from the UI or by the sensor fails closed too.
"""

from digest_pipeline.cli.context import Context, UsageError
from digest_pipeline.domain.unsubscribe import public_secret_refusal


class PublicSecretRefused(UsageError):
    """The public demo unsubscribe secret was configured for a ledger without demo data."""


def require_private_secret(ctx: Context, what: str) -> None:
    """Raises PublicSecretRefused unless the secret is private or the ledger is the demo's."""
    refusal = public_secret_refusal(
        ctx.settings.unsubscribe_secret, ctx.ledger.holds_demo_data, what=what
    )
    if refusal is not None:
        raise PublicSecretRefused(refusal)
