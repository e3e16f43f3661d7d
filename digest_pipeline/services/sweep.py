"""The periodic sweep: recover expired leases, reconcile unknowns, deliver due retries, clean.

It is what the Dagster sensor and `digest sweep` run; every step is idempotent, so running it
twice, or from two places at once, is safe. A missed week (its window closed before any attempt)
and a period whose frozen snapshot changed after the freeze are left untouched and reported in
`refused`, as `digest run` refuses them; the other periods go on. A delivery the circuit breaker
stops (the provider fails every send the same way) ends the sweep's deliveries, not its cleanup,
and is reported in `stopped`.
"""

from dataclasses import dataclass, field

from digest_pipeline.domain.errors import BreakerOpen, SnapshotTampered
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
    #: periods the sweep left alone (a missed week, a changed snapshot), with the one-line reason
    refused: dict[Period, str] = field(default_factory=dict)
    #: the one line of a delivery the circuit breaker stopped, or None
    stopped: str | None = None

    def refuse(self, period: Period, why: str) -> None:
        self.refused[period] = why
        if period in self.periods:
            self.periods.remove(period)


def _deliver(
    deliverer: Deliverer,
    report: SweepReport,
    batch_size: int,
    concurrency: int,
    breaker_threshold: int | None,
) -> None:
    """Delivers every due item of the periods not refused; a refusal found on the way is added."""

    def run(period: Period | None) -> None:
        deliver_due(
            deliverer,
            batch_size=batch_size,
            concurrency=concurrency,
            period=period,
            breaker_threshold=breaker_threshold,
            report=report.delivered,
        )

    try:
        if not report.refused:
            try:
                run(None)
                return
            except SnapshotTampered as e:  # changed since this sweep checked it
                report.refuse(Period.parse(e.period), str(e))
        # one claim loop per period, so a refused period's items are never claimed
        for period in list(report.periods):
            try:
                run(period)
            except SnapshotTampered as e:
                report.refuse(period, str(e))
    except BreakerOpen as e:
        report.stopped = str(e)


def sweep(
    deliverer: Deliverer,
    *,
    batch_size: int,
    concurrency: int,
    cleanup_mode: CleanupMode | None = CleanupMode.ARCHIVE,
    breaker_threshold: int | None = None,
) -> SweepReport:
    """One pass over every open period; `cleanup_mode=None` leaves cleanup to the asset graph.

    `breaker_threshold` stops the deliveries after that many consecutive attempts failed with
    the same code (None: never); see `deliver_due`.
    """
    ledger, clock = deliverer.ledger, deliverer.clock
    report = SweepReport(recovered=ledger.recover_expired_leases(clock.now()))
    for period in ledger.open_periods():
        why = late.refusal(ledger, deliverer.policy, period, clock.now())
        if why is None:
            why = deliverer.snapshot_refusal(period)
        if why is None:
            report.periods.append(period)
        else:
            report.refused[period] = why
    for period in report.periods:
        report.reconciled[period] = reconcile_period(
            ledger, deliverer.mailer, clock, deliverer.policy, period
        )
    _deliver(deliverer, report, batch_size, concurrency, breaker_threshold)
    if cleanup_mode is not None:
        for period in list(report.periods):
            try:
                report.cleaned[period] = clean_period(ledger, clock, period, cleanup_mode)
            except SnapshotTampered as e:  # changed since this sweep checked it
                report.refuse(period, str(e))
    log_event(
        "sweep",
        periods=len(report.periods),
        requeued=len(report.recovered.requeued),
        unknown=len(report.recovered.unknown),
        claimed=report.delivered.claimed,
        refused=len(report.refused),
        stopped="breaker_open" if report.stopped else None,
    )
    return report
