"""The refusals every step that starts a week's delivery asks for before it records anything.

A missed week (its window closed before any attempt) fails the step with the same one line
`digest run` prints, so a UI or schedule run of it is red with the reason, never a quiet green.
So does a week whose frozen snapshot changed after the freeze, a delivery whose links the
public demo secret (or a secret other than the one the ledger recorded) would sign, or that
would carry a non-public or plain-http unsubscribe link or no postal address off a demo ledger,
a ledger whose database can lose commits in a crash (`fsync`/`synchronous_commit` off), and a
delivery the circuit breaker stopped: `refused` turns the services' named errors into a
`dg.Failure` with their line.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg

from digest_pipeline.adapters.sql.base import SqlBase
from digest_pipeline.adapters.sql.durability import read_durability
from digest_pipeline.domain.durability import durability_refusal
from digest_pipeline.domain.errors import BreakerOpen, LateWeekRefused, SnapshotTampered
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.ports import Clock, Composer, Ledger
from digest_pipeline.services import late
from digest_pipeline.services.link_secrets import start_refusal
from digest_pipeline.services.snapshot_gate import require_unchanged_snapshot


@contextmanager
def refused() -> Iterator[None]:
    """Raises `dg.Failure` (no step retry) with the line of a refusal raised inside."""
    try:
        yield
    except (LateWeekRefused, SnapshotTampered, BreakerOpen) as e:
        raise dg.Failure(description=str(e), allow_retries=False) from None


def refuse_missed_week(
    ledger: Ledger, policy: DeliveryPolicy, clock: Clock, period: Period
) -> None:
    """Raises `dg.Failure` (no step retry) with the refusal's line for a missed week."""
    with refused():
        late.require_deliverable(ledger, policy, period, clock.now())


def refuse_link_settings(ledger: Ledger, composer: Composer, clock: Clock) -> None:
    """Raises `dg.Failure` (no step retry) unless the composer may send this ledger's digests.

    The public demo secret and a short one, a non-public or plain-http unsubscribe link and a
    missing postal address only on a demo ledger; any secret only when its fingerprint is the
    one the ledger recorded (services/link_secrets.py), so a daemon left with another secret
    sends nothing. A composer that signs no links (a test's fake) is not asked.
    """
    secret = composer.unsubscribe_secret
    if secret is None:
        return
    refusal = start_refusal(ledger, secret, composer.compliance, clock.now(), what="delivery")
    if refusal is not None:
        raise dg.Failure(description=refusal, allow_retries=False)


def refuse_nondurable_ledger(ledger: Ledger, allowed: bool) -> None:
    """Raises `dg.Failure` (no step retry) when the ledger's database can lose commits.

    `allowed` is `DIGEST_ALLOW_NONDURABLE_LEDGER`. A ledger that is not SQL (a test's fake) has
    no database to ask.
    """
    if not isinstance(ledger, SqlBase):
        return
    refusal = durability_refusal(read_durability(ledger.engine), allowed=allowed, what="delivery")
    if refusal is not None:
        raise dg.Failure(description=refusal, allow_retries=False)


def refuse_changed_snapshot(ledger: Ledger, clock: Clock, period: Period) -> None:
    """Raises `dg.Failure` (no step retry) for a week whose frozen snapshot changed."""
    with refused():
        require_unchanged_snapshot(ledger, period, clock.now())
