"""The period's numbers for asset metadata, `digest status` and the simulator.

Everything is read from the ledger, so a re-run reports what actually happened, not what one
process saw.
"""

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from digest_pipeline.domain.failures import FailureClass
from digest_pipeline.domain.feedback import FeedbackCounts
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.ports import Ledger


@dataclass(frozen=True)
class PeriodMetrics:
    period: Period
    eligible: int
    by_state: dict[str, int]
    attempts: int
    #: attempts with an outcome (not still open): the denominator of `retry_rate`
    finished_attempts: int
    #: failed attempts of each class divided by all finished attempts
    retry_rate: dict[str, float]
    #: per item: its first claim minus its own enqueue time (never a claim batch's or period's)
    enqueue_to_claim_p50_s: float | None
    enqueue_to_claim_p95_s: float | None
    oldest_pending_age_s: float | None
    #: repeats the provider recognised by idempotency key (not deliveries)
    duplicates_suppressed: int
    #: keys whose history may hold more than one delivery: confirmed sends, plus attempts whose
    #: outcome is unknown and that nothing since showed undelivered (invariant 4; must be 0; an
    #: operator's accepted possible duplicate counts)
    duplicate_sends: int
    cleanup_lag_p50_s: float | None
    cleanup_lag_max_s: float | None
    dead_letters: dict[str, int]
    #: what customers and the provider said about the week's digests (issue 16)
    feedback: FeedbackCounts = field(default_factory=FeedbackCounts)

    @property
    def delivered(self) -> int:
        """Items the provider confirmed: `sent`, and `sent` then `cleaned`."""
        return self.by_state.get(DeliveryState.SENT.value, 0) + self.by_state.get(
            DeliveryState.CLEANED.value, 0
        )

    @property
    def delivered_fraction(self) -> float | None:
        """`delivered` / `eligible` in [0, 1]; None for a period with nobody eligible."""
        return self.delivered / self.eligible if self.eligible else None

    @property
    def complaint_rate(self) -> float | None:
        """Complaints / delivered in [0, 1]; None before anything was delivered."""
        return self.feedback.complaints / self.delivered if self.delivered else None

    def as_flat_dict(self) -> dict[str, float | int | str | None]:
        """Scalar metrics with stable names, for metadata and JSON."""
        flat: dict[str, float | int | str | None] = {
            "period": str(self.period),
            "eligible": self.eligible,
            "attempts": self.attempts,
            "delivered": self.delivered,
            "delivered_fraction": self.delivered_fraction,
            "enqueue_to_claim_p50_s": self.enqueue_to_claim_p50_s,
            "enqueue_to_claim_p95_s": self.enqueue_to_claim_p95_s,
            "oldest_pending_age_s": self.oldest_pending_age_s,
            "duplicates_suppressed": self.duplicates_suppressed,
            "duplicate_sends": self.duplicate_sends,
            "cleanup_lag_p50_s": self.cleanup_lag_p50_s,
            "cleanup_lag_max_s": self.cleanup_lag_max_s,
            "dead_lettered_rows": sum(self.dead_letters.values()),
            "unsubscribes": self.feedback.unsubscribes,
            "hard_bounces": self.feedback.hard_bounces,
            "complaints": self.feedback.complaints,
            "complaint_rate": self.complaint_rate,
        }
        flat |= {s: self.by_state.get(s, 0) for s in (st.value for st in DeliveryState)}
        flat |= {f"retry_rate_{k}": v for k, v in self.retry_rate.items()}
        return flat


def period_metrics(ledger: Ledger, period: Period, now: datetime) -> PeriodMetrics:
    """Computes the period's metrics from the ledger."""
    snapshot = ledger.snapshot(period)
    outcomes = ledger.attempt_outcome_counts(period)
    finished = sum(n for k, n in outcomes.items() if k not in ("open", "duplicate"))
    retry_rate = {
        fc.value: (outcomes.get(fc.value, 0) / finished if finished else 0.0) for fc in FailureClass
    }
    times = ledger.item_time_summary(period)
    [double_sends] = [
        r.violations for r in ledger.check_invariants(period, now, names={"no_duplicate_send"})
    ]
    return PeriodMetrics(
        period=period,
        eligible=snapshot.eligible_count if snapshot else 0,
        by_state={s.value: n for s, n in ledger.state_counts(period).items()},
        attempts=finished + outcomes.get("open", 0),
        finished_attempts=finished,
        retry_rate=retry_rate,
        enqueue_to_claim_p50_s=times.claim_delay_p50_s,
        enqueue_to_claim_p95_s=times.claim_delay_p95_s,
        oldest_pending_age_s=(
            (now - times.oldest_waiting_created_at).total_seconds()
            if times.oldest_waiting_created_at
            else None
        ),
        duplicates_suppressed=outcomes.get("duplicate", 0),
        duplicate_sends=double_sends,
        cleanup_lag_p50_s=times.cleanup_lag_p50_s,
        cleanup_lag_max_s=times.cleanup_lag_max_s,
        dead_letters=dict(Counter(d.reason for d in ledger.dead_letters(period))),
        feedback=ledger.feedback_counts(period),
    )
