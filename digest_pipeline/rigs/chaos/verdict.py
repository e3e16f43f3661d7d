"""The chaos run's accounting and verdict: its figures, and every check that decides pass or fail.

Its own module because what a run proves (read from the provider's store, the ledger and the
workers' records after the fact) is apart from how the run is driven.
"""

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime

from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.rigs.chaos.fleet import Fleet
from digest_pipeline.rigs.chaos.settings import ChaosSettings
from digest_pipeline.rigs.servers.provider_server import ProviderServer


class ChaosFailed(AssertionError):
    """A check failed; the message carries the figures and the worker logs."""


@dataclass
class ChaosReport:
    """The figures of one run and the checks that failed (none: the run passed)."""

    settings: ChaosSettings
    period: Period
    items: int = 0
    rounds: int = 0
    kills: int = 0
    kills_mid_work: int = 0
    rounds_mid_work: int = 0
    #: items not yet terminal when the last kill landed: the work the recovery time includes
    left_at_last_kill: int = 0
    processes_started: int = 0
    provider_deliveries: int = 0
    provider_duplicates: int = 0
    suppressed_replays: int = 0
    provider_requests: int = 0
    provider_conflicts_in_flight: int = 0
    provider_replies_cut: int = 0
    attempts: dict[str, int] = field(default_factory=dict)
    attempts_cut_off: int = 0
    leases_requeued: int = 0
    leases_to_unknown: int = 0
    unknowns_seen: int = 0
    unknowns_left: int = 0
    reconciled: dict[str, int] = field(default_factory=dict)
    lost_races: dict[str, int] = field(default_factory=dict)
    states: dict[str, int] = field(default_factory=dict)
    cleanups: int = 0
    recovery_seconds: float | None = None
    drain_seconds: float | None = None
    wall_seconds: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def lines(self) -> list[str]:
        s = self.settings

        def secs(value: float | None) -> str:
            return "n/a" if value is None else f"{value:.1f} s"

        attempts = ", ".join(f"{k} {v}" for k, v in sorted(self.attempts.items())) or "none"
        reconciled = ", ".join(f"{k} {v}" for k, v in sorted(self.reconciled.items())) or "none"
        races = ", ".join(f"{k} {v}" for k, v in sorted(self.lost_races.items()))
        return [
            f"chaos: {self.items} items of {self.period}, {s.workers} worker processes "
            f"(concurrency {s.concurrency}, lease {s.lease_seconds:g} s), seed {s.seed}",
            f"rounds                                 {self.rounds}",
            f"kills (SIGKILL)                        {self.kills} "
            f"({self.kills_mid_work} while items were left; "
            f"{self.processes_started} worker processes started)",
            f"items                                  {self.items} "
            f"(end states: {self._states()}; cleanup rows {self.cleanups})",
            f"provider deliveries                    {self.provider_deliveries}",
            f"duplicate deliveries (provider-side)   {self.provider_duplicates}",
            f"duplicates suppressed by the provider  {self.suppressed_replays} replays "
            f"({self.provider_conflicts_in_flight} more refused with 409 while in flight)",
            f"provider requests                      {self.provider_requests} "
            f"({self.provider_replies_cut} replies cut off by a kill)",
            f"attempts                               {sum(self.attempts.values())} ({attempts})",
            f"attempts cut off mid-send              {self.attempts_cut_off}",
            f"expired leases recovered (by workers)  {self.leases_requeued} requeued, "
            f"{self.leases_to_unknown} to unknown",
            f"unknowns seen during the run           {self.unknowns_seen} "
            f"(reconciled by evidence: {reconciled})",
            f"unknowns left at the end               {self.unknowns_left}",
            f"lost races (reported by workers)       {sum(self.lost_races.values())} ({races})",
            f"recovery time after the last kill      {secs(self.recovery_seconds)} "
            f"(until every item was terminal; {self.left_at_last_kill} were not at that kill)",
            f"drain time (workers started to done)   {secs(self.drain_seconds)}",
            f"wall time (seed to verdict)            {secs(self.wall_seconds)}",
            "verdict                                "
            + ("PASS" if self.passed else f"FAIL ({len(self.failures)} checks)"),
        ]

    def _states(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(self.states.items())) or "none"


def measure(
    report: ChaosReport,
    ledger: SqlLedger,
    provider: ProviderServer,
    fleet: Fleet,
    keys: list[str],
) -> None:
    """The figures, from the provider's store, the ledger and the workers' pass records."""
    period = report.period
    report.items = len(keys)
    report.states = {s.value: n for s, n in ledger.state_counts(period).items()}
    report.provider_deliveries = sum(len(v) for v in provider.stored.values())
    report.provider_duplicates = sum(max(provider.delivered_count(k) - 1, 0) for k in keys)
    report.suppressed_replays = sum(provider.replays(k) for k in keys)
    report.provider_requests = provider.requests
    report.provider_replies_cut = provider.handler_errors
    report.attempts = ledger.attempt_outcome_counts(period)
    tally = ledger.attempt_tally(period)
    report.attempts_cut_off = tally.open_attempts
    report.provider_conflicts_in_flight = ledger.attempts_with_detail(
        period, "http:409:concurrent_idempotent_requests"
    )
    report.unknowns_seen = ledger.keys_ever_unknown(period)
    report.cleanups = sum(ledger.cleanup_rows_per_key(period).values())
    report.unknowns_left = report.states.get(DeliveryState.UNKNOWN.value, 0)
    reconciled: Counter[str] = Counter()
    races: Counter[str] = Counter({"deliver": 0, "reconcile": 0, "cleanup": 0})
    for record in fleet.records():
        report.leases_requeued += int(record.get("requeued", 0))
        report.leases_to_unknown += int(record.get("recovered_unknown", 0))
        reconciled.update(record.get("reconciled", {}))
        races.update(record.get("lost_races", {}))
    report.reconciled, report.lost_races = dict(reconciled), dict(races)


def check(
    report: ChaosReport,
    ledger: SqlLedger,
    provider: ProviderServer,
    fleet: Fleet,
    keys: list[str],
) -> None:
    """Every check of the experiment; each failure is one line in `report.failures`."""
    fail = report.failures.append
    selected = set(keys)

    def sample(found: list[str] | set[str]) -> str:
        ordered = sorted(found)
        return ", ".join(ordered[:5]) + (" ..." if len(ordered) > 5 else "")

    # every selected customer delivered exactly once, by the provider's own store
    not_once = {k: provider.delivered_count(k) for k in keys if provider.delivered_count(k) != 1}
    if not_once:
        counts = Counter(not_once.values())
        fail(
            f"{len(not_once)} keys not delivered exactly once (deliveries: {dict(counts)}): "
            f"{sample(set(not_once))}"
        )
    if strangers := set(provider.stored) - selected:
        fail(f"the provider stored {len(strangers)} keys nobody selected: {sample(strangers)}")
    # no item lost or stuck; every one cleaned
    items = {str(i.key): i for i in ledger.items(report.period)}
    if lost := selected - set(items):
        fail(f"{len(lost)} selected customers have no work item: {sample(lost)}")
    if extra := set(items) - selected:
        fail(f"{len(extra)} work items for customers nobody selected: {sample(extra)}")
    if not_cleaned := {k for k, i in items.items() if i.state is not DeliveryState.CLEANED}:
        states = Counter(items[k].state.value for k in not_cleaned)
        fail(f"{len(not_cleaned)} items not cleaned ({dict(states)}): {sample(not_cleaned)}")
    # every sent item cleaned exactly once: one cleanup row per key
    rows = ledger.cleanup_rows_per_key(report.period)
    if wrong := {k for k in selected | set(rows) if rows.get(k, 0) != 1}:
        fail(f"{len(wrong)} keys without exactly one cleanup row: {sample(wrong)}")
    # design §4, on what the ledger recorded (no_silent_timeout among them)
    for result in ledger.check_invariants(report.period, datetime.now(UTC)):
        if not result.passed:
            fail(f"invariant {result.name} failed for {result.violations} keys: {result.sample}")
    # the experiment itself: kills landed on live work, and the survivors finished cleanly
    if report.rounds_mid_work < report.settings.rounds or report.kills_mid_work < report.kills:
        fail(
            f"only {report.rounds_mid_work} of {report.settings.rounds} rounds "
            f"({report.kills_mid_work} of {report.kills} kills) landed while items were left: "
            "the run proves less than it claims"
        )
    if bad := [i for i in fleet.current.values() if i.process.returncode != 0]:
        fail("workers of the last generation did not exit 0: " + ", ".join(i.name for i in bad))
