"""Fail closed on a wrong unsubscribe secret: `digest run`, `sweep` and `serve` check it here first.

`DIGEST_UNSUBSCRIBE_SECRET` defaults to a value printed in this repository, and a short one can
be guessed from a single link: both may sign and check links only on a ledger `digest seed`
filled with demo data. Any other secret must be the one whose fingerprint the ledger recorded
(services/link_secrets.py), or the command stops with one line (exit 2) before it sends or
listens. The Dagster delivery step asks the same (`defs/guards.py`), so a run launched from the
UI or by the sensor fails closed too.
"""

from digest_pipeline.cli.context import Context, UsageError
from digest_pipeline.services.link_secrets import secret_refusal


class PublicSecretRefused(UsageError):
    """The unsubscribe secret is public, short, or not the one the ledger recorded."""


def require_private_secret(ctx: Context, what: str) -> None:
    """Raises PublicSecretRefused unless the secret may sign and check this ledger's links."""
    refusal = secret_refusal(
        ctx.ledger, ctx.settings.unsubscribe_secret, ctx.clock.now(), what=what
    )
    if refusal is not None:
        raise PublicSecretRefused(refusal)
