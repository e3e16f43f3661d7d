"""The refusals a step that starts a week's delivery asks for before it records anything.

A missed week (its window closed before any attempt), a frozen snapshot changed after the freeze,
links the public demo secret (or a secret other than the one the ledger recorded) would sign, a
non-public or plain-http unsubscribe link or no postal address off a demo ledger, and a ledger
that can lose commits in a crash: each is one line. A step that meets one records nothing and
materialises nothing (`refuse_week`): the run ends with the line as its `digest/refused` tag and
as an observation of the week's asset, and the checks of the steps it skipped read as skipped,
not failed, since nothing could have been sent. A circuit breaker that stops a delivery part-way
still fails its step (`refused`): something was sent, and the run must show it did not finish.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import dagster as dg

from digest_pipeline.adapters.sql.base import SqlBase
from digest_pipeline.adapters.sql.durability import read_durability
from digest_pipeline.component.late_grant import late_request, record_grant
from digest_pipeline.component.report import period_metadata
from digest_pipeline.component.resources import DeliverySettings
from digest_pipeline.component.run_ledger import REFUSED
from digest_pipeline.domain.durability import durability_refusal
from digest_pipeline.domain.errors import BreakerOpen, LateWeekRefused, SnapshotTampered
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.ports import Clock, Composer, Ledger
from digest_pipeline.services import period_gate
from digest_pipeline.services.link_secrets import start_refusal
from digest_pipeline.services.period_gate import snapshot_refusal

#: the run tag that holds a refused week's line: the run list and the run's page show it
REFUSED_TAG = "digest/refused"

#: one refusal to ask for: its line, or None
Refusal = Callable[[], str | None]


@contextmanager
def refused() -> Iterator[None]:
    """Raises `dg.Failure` (no step retry) with the line of a refusal raised inside."""
    try:
        yield
    except (LateWeekRefused, SnapshotTampered, BreakerOpen) as e:
        raise dg.Failure(description=str(e), allow_retries=False) from None


def first_refusal(*refusals: Refusal) -> str | None:
    """The line of the first refusal that refuses, asking no further; None when none does.

    Order matters: a refusal that records something when it passes (the link secret's first
    fingerprint) goes last, so a week refused for another reason records nothing.
    """
    for refusal in refusals:
        if (line := refusal()) is not None:
            return line
    return None


def missed_week(ledger: Ledger, policy: DeliveryPolicy, clock: Clock, period: Period) -> Refusal:
    """A week whose delivery window closed before any attempt (`DIGEST_LATE_WINDOW_SECONDS`)."""
    return lambda: period_gate.refusal(ledger, policy, period, clock.now())


def changed_snapshot(ledger: Ledger, clock: Clock, period: Period) -> Refusal:
    """A week whose frozen snapshot no longer matches its fingerprint."""
    return lambda: snapshot_refusal(ledger, period, clock.now())


def nondurable_ledger(ledger: Ledger, allowed: bool) -> Refusal:
    """A ledger whose database can lose commits (`allowed` is DIGEST_ALLOW_NONDURABLE_LEDGER).

    A ledger that is not SQL (a test's fake) has no database to ask.
    """

    def refusal() -> str | None:
        if not isinstance(ledger, SqlBase):
            return None
        durability = read_durability(ledger.engine)
        return durability_refusal(durability, allowed=allowed, what="delivery")

    return refusal


def link_settings(ledger: Ledger, composer: Composer, clock: Clock) -> Refusal:
    """Links or a footer the composer may not send on this ledger (services/link_secrets.py).

    The public demo secret and a short one, a non-public or plain-http unsubscribe link and a
    missing postal address only on a demo ledger; any secret only when its fingerprint is the
    one the ledger recorded (recorded here when it has none), so a daemon left with another
    secret sends nothing. A composer that signs no links (a test's fake) is not asked.
    """

    def refusal() -> str | None:
        secret = composer.unsubscribe_secret
        if secret is None:
            return None
        return start_refusal(ledger, secret, composer.compliance, clock.now(), what="delivery")

    return refusal


def week_refusal(
    context: dg.AssetExecutionContext,
    ledger: Ledger,
    composer: Composer,
    clock: Clock,
    settings: DeliverySettings,
    period: Period,
) -> str | None:
    """Why the week's first step must not start, or None; records a late grant its tags ask for.

    In the order `digest run` asks: the grant's tags, the ledger's durability, the window (a
    run tagged for a late window skips it), then the links, which record the secret's first
    fingerprint. The grant is recorded last, once nothing refused, and only for a missed week.
    """
    request = late_request(context.run.tags, settings.operators)
    if isinstance(request, str):
        return f"period {period}: {request}"
    missed = missed_week(ledger, settings.policy, clock, period)
    line = first_refusal(
        nondurable_ledger(ledger, settings.allow_nondurable_ledger),
        missed if request is None else lambda: None,
        link_settings(ledger, composer, clock),
    )
    if line is None and request is not None and missed() is not None:
        record_grant(context, ledger, settings, clock, period, request)
    return line


def refuse_week(
    context: dg.OpExecutionContext | dg.AssetExecutionContext,
    period: Period,
    asset: dg.AssetKey,
    line: str,
) -> None:
    """Records a refused week on the run and on `asset`'s partition; the step then yields nothing.

    The line goes to the run's event log (starting `refused: `, as `digest run` prints it), to
    the run's `digest/refused` tag, and to an observation of `asset` for the week, which the
    asset's partition page lists with its metadata `refused`.
    """
    context.log.warning(f"{REFUSED}{line}")
    context.instance.add_run_tags(context.run.run_id, {REFUSED_TAG: line})
    context.log_event(
        dg.AssetObservation(
            asset_key=asset,
            partition=context.partition_key,
            description=line,
            metadata={**period_metadata(period), "refused": dg.MetadataValue.text(line)},
        )
    )


def refuse_link_settings(ledger: Ledger, composer: Composer, clock: Clock) -> None:
    """Raises `dg.Failure` (no step retry) unless the composer may send this ledger's digests.

    A delivery step asks again, after the week's first step did: a step on another worker may
    have been started with other settings.
    """
    if (line := link_settings(ledger, composer, clock)()) is not None:
        raise dg.Failure(description=line, allow_retries=False)


def refuse_nondurable_ledger(ledger: Ledger, allowed: bool) -> None:
    """Raises `dg.Failure` (no step retry) when the ledger's database can lose commits."""
    if (line := nondurable_ledger(ledger, allowed)()) is not None:
        raise dg.Failure(description=line, allow_retries=False)
