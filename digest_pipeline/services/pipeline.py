"""The period pipeline: its gates in one fixed order, `GATES`, for every loop that runs them.

A pass recovers expired leases, admits the periods (a missed week, or a period whose frozen
snapshot changed after the freeze, is left untouched and reported in `refused`, as `digest run`
refuses it), reconciles `unknown` items, delivers what is due and cleans what was sent. `digest
sweep` and the chaos worker run `run_pass`; the simulator's sweeper and the Dagster ops call the
gates one by one (the weekly graph settles, i.e. reconciles, after its delivery step, so a run's
metadata reports the unknowns it made). Every gate is idempotent: a pass run twice, or from two
places at once, is safe. A delivery the circuit breaker stops ends the pass's deliveries, not
its cleanup, and is reported in `stopped`.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from digest_pipeline.domain.errors import BreakerOpen, SnapshotTampered
from digest_pipeline.domain.model import CleanupMode, LeaseRecovery
from digest_pipeline.domain.periods import Period
from digest_pipeline.services import period_gate
from digest_pipeline.services.cleanup import CleanupReport, clean_period
from digest_pipeline.services.deliver import Deliverer, deliver_due
from digest_pipeline.services.logs import step_log
from digest_pipeline.services.reconcile import ReconcileReport, reconcile_period
from digest_pipeline.services.wave import DeliveryReport


class Gate(StrEnum):
    """One step of a pass over the open periods."""

    RECOVER = "recover"
    ADMIT = "admit"
    RECONCILE = "reconcile"
    DELIVER = "deliver"
    CLEAN = "clean"


#: the order of a pass: nothing is reconciled before expired leases are recovered (a dead claim
#: with an open attempt becomes `unknown` first), nothing delivered before it is admitted and its
#: unknowns reconciled (one the provider never got is delivered in the same pass), and cleanup
#: sees every send the pass recorded
GATES = (Gate.RECOVER, Gate.ADMIT, Gate.RECONCILE, Gate.DELIVER, Gate.CLEAN)

#: called after each gate with the gate and the pass's report so far (the chaos worker records
#: one line per gate, so a kill loses only the counts of the gate it cuts)
GateHook = Callable[[Gate, "SweepReport"], None]


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
    max_items: int | None,
    all_open: bool,
) -> None:
    """Delivers every due item of the periods not refused; a refusal found on the way is added."""

    def run(period: Period | None) -> None:
        deliver_due(
            deliverer,
            batch_size=batch_size,
            concurrency=concurrency,
            period=period,
            max_items=max_items,
            breaker_threshold=breaker_threshold,
            report=report.delivered,
        )

    try:
        # one claim loop over everything open, unless a period was refused or periods were named
        if all_open and not report.refused:
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
    return run_pass(
        deliverer,
        batch_size=batch_size,
        concurrency=concurrency,
        cleanup_mode=cleanup_mode,
        breaker_threshold=breaker_threshold,
    )


def run_pass(
    deliverer: Deliverer,
    periods: Sequence[Period] | None = None,
    *,
    batch_size: int,
    concurrency: int,
    cleanup_mode: CleanupMode | None = CleanupMode.ARCHIVE,
    breaker_threshold: int | None = None,
    max_items: int | None = None,
    on_gate: GateHook | None = None,
) -> SweepReport:
    """The gates of `GATES` once, in order, over `periods` (None: every open period).

    `max_items` bounds the claims of the delivery gate; `on_gate` sees the report after each gate.
    """
    ledger, clock, policy = deliverer.ledger, deliverer.clock, deliverer.policy

    def passed(gate: Gate) -> None:
        if on_gate is not None:
            on_gate(gate, report)

    report = SweepReport(recovered=ledger.recover_expired_leases(clock.now()))
    passed(Gate.RECOVER)
    for period in ledger.open_periods() if periods is None else periods:
        why = period_gate.refusal(ledger, policy, period, clock.now())
        if why is None:
            why = deliverer.facts(period, clock.now()).refusal
        if why is None:
            report.periods.append(period)
        else:
            report.refused[period] = why
    passed(Gate.ADMIT)
    for period in report.periods:
        report.reconciled[period] = reconcile_period(
            ledger, deliverer.mailer, clock, policy, period
        )
    passed(Gate.RECONCILE)
    _deliver(
        deliverer, report, batch_size, concurrency, breaker_threshold, max_items, periods is None
    )
    passed(Gate.DELIVER)
    if cleanup_mode is not None:
        for period in list(report.periods):
            try:
                report.cleaned[period] = clean_period(
                    ledger, clock, period, cleanup_mode, executor=deliverer.executor
                )
            except SnapshotTampered as e:  # changed since this pass checked it
                report.refuse(period, str(e))
    passed(Gate.CLEAN)
    step_log.info(
        "sweep",
        periods=len(report.periods),
        requeued=len(report.recovered.requeued),
        unknown=len(report.recovered.unknown),
        claimed=report.delivered.claimed,
        refused=len(report.refused),
        stopped="breaker_open" if report.stopped else None,
    )
    return report
