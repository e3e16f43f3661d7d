"""The periodic sweep: recover expired leases, reconcile unknowns, deliver due retries, clean.

It is what the Dagster sensor and `digest sweep` run; every step is idempotent, so running it
twice, or from two places at once, is safe. A missed week (its window closed before any attempt)
is left untouched and reported in `refused`, as `digest run` refuses it.
"""

from dataclasses import dataclass, field

from digest_pipeline.domain.model import CleanupMode, LeaseRecovery
from digest_pipeline.domain.periods import Period
from digest_pipeline.services import late
from digest_pipeline.services.cleanup import CleanupReport, clean_period
from digest_pipeline.services.deliver import Deliverer, DeliveryReport, deliver_due
from digest_pipeline.services.logs import log_event
from digest_pipeline.services.reconcile import ReconcileReport, reconcile_period


@dataclass
class SweepReport:
    recovered: LeaseRecovery
    periods: list[Period] = field(default_factory=list)
    reconciled: dict[Period, ReconcileReport] = field(default_factory=dict)
    delivered: DeliveryReport = field(default_factory=DeliveryReport)
    cleaned: dict[Period, CleanupReport] = field(default_factory=dict)
    #: missed weeks the sweep left alone, with the one-line reason
    refused: dict[Period, str] = field(default_factory=dict)


def sweep(
    deliverer: Deliverer,
    *,
    batch_size: int,
    concurrency: int,
    cleanup_mode: CleanupMode | None = CleanupMode.ARCHIVE,
) -> SweepReport:
    """One pass over every open period; `cleanup_mode=None` leaves cleanup to the asset graph."""
    ledger, clock = deliverer.ledger, deliverer.clock
    report = SweepReport(recovered=ledger.recover_expired_leases(clock.now()))
    for period in ledger.open_periods():
        why = late.refusal(ledger, deliverer.policy, period, clock.now())
        if why is None:
            report.periods.append(period)
        else:
            report.refused[period] = why
    for period in report.periods:
        report.reconciled[period] = reconcile_period(
            ledger, deliverer.mailer, clock, deliverer.policy, period
        )
    if not report.refused:
        report.delivered = deliver_due(deliverer, batch_size=batch_size, concurrency=concurrency)
    for period in report.periods if report.refused else ():
        # one claim loop per period, so a refused week's items are never claimed
        done = deliver_due(deliverer, batch_size=batch_size, concurrency=concurrency, period=period)
        report.delivered.claimed += done.claimed
        report.delivered.outcomes.update(done.outcomes)
        report.delivered.lost_races += done.lost_races
    if cleanup_mode is not None:
        for period in report.periods:
            report.cleaned[period] = clean_period(ledger, clock, period, cleanup_mode)
    log_event(
        "sweep",
        periods=len(report.periods),
        requeued=len(report.recovered.requeued),
        unknown=len(report.recovered.unknown),
        claimed=report.delivered.claimed,
        refused=len(report.refused),
    )
    return report
