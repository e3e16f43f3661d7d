"""Reconciliation of `unknown` items, in design §2's order: ledger evidence, then the mailer.

An item is moved only on evidence (`domain.reconciliation.settle_unknown` decides which): a
confirmed attempt in the ledger, attempts that all closed as not accepted, the mailer's lookup,
or a provider that will deduplicate a resend inside its idempotency window. The last two count
only from the mailer that made the uncertain attempt; under another the item is left alone and
counted by the mailer it needs. Without evidence it stays `unknown` (visible, rows kept) until
its retention runs out and it is dead-lettered.
"""

from collections import Counter
from dataclasses import dataclass, field
from functools import partial

from digest_pipeline.domain.errors import LostRace
from digest_pipeline.domain.mailer_identity import describe_needed, foreign_mailers
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.reconciliation import settle_unknown
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.ports.outside import Clock, Mailer
from digest_pipeline.services import period_gate
from digest_pipeline.services.combined_roles import WorkLedger
from digest_pipeline.services.evidence import RECONCILE_ACTOR
from digest_pipeline.services.logs import item_log

ACTOR = RECONCILE_ACTOR


@dataclass
class ReconcileReport:
    """How the period's `unknown` items were settled, by the state they moved to."""

    examined: int = 0
    moved: Counter[str] = field(default_factory=Counter)
    #: evidence used, e.g. `ledger_attempt`, `mailer_lookup_found`, `idempotent_resend`
    evidence: Counter[str] = field(default_factory=Counter)
    still_unknown: int = 0
    #: of `still_unknown`, those left alone because an attempt that may have delivered was made
    #: through another mailer, counted by the mailers they need (`domain.mailer_identity`)
    needs_mailer: Counter[str] = field(default_factory=Counter)
    lost_races: int = 0
    #: every move made, as (operation key, new state, evidence), for the operator's terminal
    changes: list[tuple[OperationKey, DeliveryState, str]] = field(default_factory=list)


def reconcile_period(
    ledger: WorkLedger, mailer: Mailer, clock: Clock, policy: DeliveryPolicy, period: Period
) -> ReconcileReport:
    """Settles what evidence allows among the period's `unknown` items."""
    report = ReconcileReport()
    unknown = ledger.items(period, [DeliveryState.UNKNOWN])
    closes = period_gate.closes_at(ledger, policy, period) if unknown else period.ends_at
    identity = mailer.identity
    for item in unknown:
        report.examined += 1
        now = clock.now()
        history = ledger.attempts(item.key)
        found = settle_unknown(
            item,
            history,
            partial(mailer.lookup, str(item.key)),
            mailer=identity,
            now=now,
            closes_at=closes,
            idempotency_window=mailer.capabilities.idempotency_window,
            policy=policy,
            actor=ACTOR,
            lookup_lag=mailer.capabilities.lookup_lag,
        )
        if found is None:
            report.still_unknown += 1
            if needed := foreign_mailers(history, identity):
                report.needs_mailer[describe_needed(needed)] += 1
            continue
        transition, evidence = found
        target = transition.target
        try:
            ledger.apply(transition)
        except LostRace as e:
            report.lost_races += 1
            item_log.warning("lost_race", key=item.key, step="reconcile", why=e)
            continue
        report.moved[target.value] += 1
        report.evidence[evidence.value] += 1
        report.changes.append((item.key, target, evidence.value))
        item_log.info("reconciled", key=item.key, state=target.value, evidence=evidence.value)
    return report
