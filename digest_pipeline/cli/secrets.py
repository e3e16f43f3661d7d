"""Fail closed on the public demo secret: `digest run`, `sweep` and `serve` check it here first.

`DIGEST_UNSUBSCRIBE_SECRET` defaults to a value printed in this repository. It may sign and check
links only on a ledger `digest seed` filled with demo data; on any other ledger the command
stops with one line (exit 2) before it sends or listens. The Dagster delivery step asks the same
(`defs/guards.py`), so a run launched from the UI or by the sensor fails closed too.
"""

from digest_pipeline.cli.context import Context, UsageError
from digest_pipeline.domain.unsubscribe import DEMO_UNSUBSCRIBE_SECRET, public_secret_refusal


class PublicSecretRefused(UsageError):
    """The public demo unsubscribe secret was configured for a ledger without demo data."""


def require_private_secret(ctx: Context, what: str) -> None:
    """Raises PublicSecretRefused unless the secret is private or the ledger is the demo's."""
    secret = ctx.settings.unsubscribe_secret
    # the ledger is read only for the public secret: a private one needs no look
    demo = secret == DEMO_UNSUBSCRIBE_SECRET and ctx.ledger.holds_demo_data()
    refusal = public_secret_refusal(secret, demo, what=what)
    if refusal is not None:
        raise PublicSecretRefused(refusal)
