"""The refusals every step that starts a week's delivery asks for before it records anything.

A missed week (its window closed before any attempt) fails the step with the same one line
`digest run` prints, so a UI or schedule run of it is red with the reason, never a quiet green.
So does a week whose frozen snapshot changed after the freeze, a delivery whose links the
public demo secret would sign on a real shop's ledger, and a delivery the circuit breaker
stopped: `refused` turns the services' named errors into a `dg.Failure` with their line.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg

from digest_pipeline.domain.errors import BreakerOpen, LateWeekRefused, SnapshotTampered
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.unsubscribe import public_secret_refusal
from digest_pipeline.ports import Clock, Composer, Ledger
from digest_pipeline.services import late
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


def refuse_public_secret(ledger: Ledger, composer: Composer) -> None:
    """Raises `dg.Failure` (no step retry) when the public demo secret would sign real links."""
    secret = composer.unsubscribe_secret
    if secret is None:
        return
    refusal = public_secret_refusal(secret, ledger.holds_demo_data, what="delivery")
    if refusal is not None:
        raise dg.Failure(description=refusal, allow_retries=False)


def refuse_changed_snapshot(ledger: Ledger, clock: Clock, period: Period) -> None:
    """Raises `dg.Failure` (no step retry) for a week whose frozen snapshot changed."""
    with refused():
        require_unchanged_snapshot(ledger, period, clock.now())
