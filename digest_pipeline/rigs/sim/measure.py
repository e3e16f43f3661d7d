"""A cell's numbers, read from the provider's own store and the ledger after the run.

Deliveries and duplicates come from the provider's store; states, attempts, retry delays,
dead letters and reconciliations from the ledger; the invariants from `Ledger.check_invariants`,
the same code the asset checks and `digest status` run. Only what neither records (cleanup
calls, claims given back, the second each backoff retry was due) comes from the run itself.
"""

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise

from digest_pipeline.domain.model import INVARIANTS, Attempt, InvariantResult, WorkItem
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.domain.timing import percentile
from digest_pipeline.ports import Ledger
from digest_pipeline.rigs.sim.config import PERIOD, Cell
from digest_pipeline.rigs.sim.faults import SimProvider

Value = bool | int | float | str | None
DEAD_LETTER_REASONS = (
    "permanent",
    "max_attempts",
    "max_age",
    "window_closed",
    "unknown_unresolved",
)
FAILURE_CLASSES = ("transient", "throttled", "permanent", "unknown")
#: states that still need the system; a drained period has none
OPEN = (
    DeliveryState.PENDING,
    DeliveryState.CLAIMED,
    DeliveryState.RETRY_SCHEDULED,
    DeliveryState.SENT,
)

#: the result columns, in output order (one row per cell)
COLUMNS: tuple[str, ...] = (
    "cell",
    "jitter",
    "workers",
    "lease_s",
    "customers",
    # the provider's store
    "provider_sends",
    "provider_deliveries",
    "keys_delivered",
    "keys_never_delivered",
    "duplicate_keys",
    "duplicate_extra",
    "duplicate_max_per_key",
    "provider_suppressed",
    # the ledger's attempts
    "attempts",
    *(f"failed_{c}" for c in FAILURE_CLASSES),
    "attempts_open",
    "transient_fraction",
    "transient_keys",
    "transient_recovered",
    "retry_delay_p50_s",
    "retry_delay_p95_s",
    "retry_delay_max_s",
    "max_retry_wakes_per_s",
    # time
    "last_sent_s",
    "drain_s",
    "drained",
    # where the items ended
    "cleaned",
    "failed",
    "dead_lettered",
    "unknown_left",
    "stale_items",
    *(f"dl_{r}" for r in DEAD_LETTER_REASONS),
    # ambiguity and leases
    "unknown_episodes",
    "reconciled_ledger_attempt",
    "reconciled_idempotent_resend",
    "lease_released",
    "lease_recovered_requeued",
    "lease_recovered_unknown",
    "lost_races",
    "late_results",
    # crash points
    "crashes_after_send",
    "crash_keys_unsent",
    "timeouts_after_accept",
    "duplicate_handoffs",
    "duplicate_handoff_attempts",
    "cleanup_attempts",
    "cleanups_completed",
    "cleanup_acks_lost",
    # design §4
    *(f"inv_{name}" for name in INVARIANTS),
    "invariants_ok",
    "invariant_failures",
)


@dataclass(frozen=True)
class Observations:
    """What the run itself saw: its identity, its timing and what no store records."""

    cell: Cell
    customers: int
    start: datetime
    finished_at: datetime
    drained: bool
    drained_at: datetime | None
    lost_races: int
    late_results: int
    handoff_keys: tuple[str, ...]
    handoff_prefix: str
    cleanup_calls: int
    cleanup_acks_lost: int
    released: int
    recovered_requeued: int
    recovered_unknown: int
    backoff_wakes: Counter[datetime]


@dataclass(frozen=True)
class CellResult:
    """One grid cell: its row (keys in `COLUMNS` order) and the ledger's invariant verdicts."""

    cell: Cell
    row: dict[str, Value]
    invariants: tuple[InvariantResult, ...]

    @property
    def ok(self) -> bool:
        return all(r.passed for r in self.invariants)


def _s(value: float | None) -> float | None:
    """Seconds rounded to the millisecond, so files are stable and readable."""
    return None if value is None else round(value, 3)


def _needs_history(item: WorkItem) -> bool:
    """Items whose attempt history holds a failure or a retry (a clean first send does not)."""
    return item.attempts > 1 or (item.attempts == 1 and item.state is not DeliveryState.CLEANED)


def _retry_delays(histories: Iterable[list[Attempt]]) -> list[float]:
    delays = []
    for attempts in histories:
        starts = [a.started_at for a in attempts]
        delays += [(b - a).total_seconds() for a, b in pairwise(starts)]
    return delays


def measure(obs: Observations, ledger: Ledger, provider: SimProvider) -> CellResult:
    """The cell's row, from the provider's store and the ledger."""
    start, cell = obs.start, obs.cell
    items = ledger.items(PERIOD)
    by_key = {str(i.key): i for i in items}
    counts = ledger.state_counts(PERIOD)
    outcomes = ledger.attempt_outcome_counts(PERIOD)
    histories = {
        k: ledger.attempts(i.key)
        for k, i in by_key.items()
        if _needs_history(i) or k in obs.handoff_keys
    }
    delivered = provider.deliveries_per_key()
    extra = [n - 1 for n in delivered.values() if n > 1]
    failures = {c: outcomes.get(c, 0) for c in FAILURE_CLASSES}
    all_failures = sum(failures.values())
    transient_keys = [k for k, h in histories.items() if any(a.outcome == "transient" for a in h)]
    done = (DeliveryState.SENT, DeliveryState.CLEANED)
    recovered = sum(by_key[k].state in done for k in transient_keys)
    delays = _retry_delays(histories.values())
    sent_times = [i.sent_at for i in items if i.sent_at is not None]
    audit = [e for e in ledger.audit_log(PERIOD) if e.from_state is DeliveryState.UNKNOWN]
    evidence = Counter(e.reason.removeprefix("evidence:") for e in audit)
    dead = Counter(d.reason for d in ledger.dead_letters(PERIOD))
    invariants = tuple(ledger.check_invariants(PERIOD, obs.finished_at))
    crashed = provider.crashed_keys
    handoff_attempts = sum(
        a.worker.startswith(obs.handoff_prefix)
        for k in set(obs.handoff_keys)
        for a in histories.get(k, [])
    )
    row: dict[str, Value] = {
        "cell": cell.label,
        "jitter": cell.jitter,
        "workers": cell.workers,
        "lease_s": cell.lease_seconds,
        "customers": obs.customers,
        "provider_sends": provider.sends,
        "provider_deliveries": sum(delivered.values()),
        "keys_delivered": len(delivered),
        "keys_never_delivered": obs.customers - len(delivered),
        "duplicate_keys": len(extra),
        "duplicate_extra": sum(extra),
        "duplicate_max_per_key": max(delivered.values(), default=0),
        "provider_suppressed": provider.suppressed,
        "attempts": sum(outcomes.get(k, 0) for k in ("sent", *FAILURE_CLASSES, "open")),
        **{f"failed_{c}": n for c, n in failures.items()},
        "attempts_open": outcomes.get("open", 0),
        "transient_fraction": (
            round(failures["transient"] / all_failures, 4) if all_failures else None
        ),
        "transient_keys": len(transient_keys),
        "transient_recovered": (
            round(recovered / len(transient_keys), 4) if transient_keys else None
        ),
        "retry_delay_p50_s": _s(percentile(delays, 50)),
        "retry_delay_p95_s": _s(percentile(delays, 95)),
        "retry_delay_max_s": _s(max(delays, default=None)),
        "max_retry_wakes_per_s": max(obs.backoff_wakes.values(), default=0),
        "last_sent_s": _s((max(sent_times) - start).total_seconds() if sent_times else None),
        "drain_s": _s((obs.drained_at - start).total_seconds() if obs.drained_at else None),
        "drained": obs.drained,
        "cleaned": counts.get(DeliveryState.CLEANED, 0),
        "failed": counts.get(DeliveryState.FAILED, 0),
        "dead_lettered": counts.get(DeliveryState.DEAD_LETTERED, 0),
        "unknown_left": counts.get(DeliveryState.UNKNOWN, 0),
        "stale_items": sum(counts.get(s, 0) for s in OPEN),
        **{f"dl_{r}": dead.get(r, 0) for r in DEAD_LETTER_REASONS},
        "unknown_episodes": len(audit) + counts.get(DeliveryState.UNKNOWN, 0),
        "reconciled_ledger_attempt": evidence.get("ledger_attempt", 0),
        "reconciled_idempotent_resend": evidence.get("idempotent_resend", 0),
        "lease_released": obs.released,
        "lease_recovered_requeued": obs.recovered_requeued,
        "lease_recovered_unknown": obs.recovered_unknown,
        "lost_races": obs.lost_races,
        "late_results": obs.late_results,
        "crashes_after_send": len(crashed),
        "crash_keys_unsent": sum(by_key[k].state not in done for k in set(crashed)),
        "timeouts_after_accept": len(provider.timed_out_keys),
        "duplicate_handoffs": len(obs.handoff_keys),
        "duplicate_handoff_attempts": handoff_attempts,
        "cleanup_attempts": obs.cleanup_calls,
        "cleanups_completed": counts.get(DeliveryState.CLEANED, 0),
        "cleanup_acks_lost": obs.cleanup_acks_lost,
        **{f"inv_{r.name}": r.passed for r in invariants},
        "invariants_ok": all(r.passed for r in invariants),
        "invariant_failures": " ".join(
            f"{r.name}:{r.violations}" for r in invariants if not r.passed
        ),
    }
    missing = [c for c in COLUMNS if c not in row]
    if missing or len(row) != len(COLUMNS):
        raise AssertionError(f"cell row does not match COLUMNS: {missing or sorted(row)}")
    return CellResult(cell, {c: row[c] for c in COLUMNS}, invariants)
