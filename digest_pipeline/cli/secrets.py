"""Fail closed on what the links would say: `digest run`, `sweep` and `serve` check it here first.

`DIGEST_UNSUBSCRIBE_SECRET` defaults to a value printed in this repository, and a short one can
be guessed from a single link: both may sign and check links only on a ledger `digest seed`
filled with demo data. So may an unsubscribe link that is not public https
(`DIGEST_UNSUBSCRIBE_URL`) and a missing `DIGEST_POSTAL_ADDRESS` (domain/compliance.py). Any
other secret must be the one whose fingerprint the ledger recorded (services/link_secrets.py),
or the command stops with one line (exit 2) before it sends or listens. The Dagster delivery
step asks the same (`component/guards.py`), so a run launched from the UI or by the sensor fails
closed too.
"""

from digest_pipeline.cli.context import Context, UsageError
from digest_pipeline.domain.compliance import Compliance
from digest_pipeline.services.link_secrets import start_refusal


class LinkSettingsRefused(UsageError):
    """The unsubscribe secret, link or postal address may not be used on this ledger."""


def compliance_of(ctx: Context) -> Compliance:
    """The unsubscribe link and postal address the configured composer puts in every digest."""
    return Compliance(ctx.settings.unsubscribe_url, ctx.settings.postal_address)


def require_link_settings(ctx: Context, what: str) -> None:
    """Raises LinkSettingsRefused unless `what` may sign links and send digests on this ledger."""
    refusal = start_refusal(
        ctx.ledger, ctx.settings.unsubscribe_secret, compliance_of(ctx), ctx.clock.now(), what=what
    )
    if refusal is not None:
        raise LinkSettingsRefused(refusal)
