"""The week's numbers as the ledger holds them, for asset metadata, `digest status` and the simulator.

Everything is read from the ledger, so a re-run reports the week, not what one run did.
`as_flat_dict` names and rounds every figure once: the UI's metadata and `digest status --json`
print the same names with the same values.
"""

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from digest_pipeline.domain.failures import FailureClass
from digest_pipeline.domain.feedback import FeedbackCounts
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.ports.ledger_roles import ContentBacklog, ReadModel
from digest_pipeline.services.combined_roles import PeriodReader


@dataclass(frozen=True)
class PeriodMetrics:
    period: Period
    eligible: int
    by_state: dict[str, int]
    attempts: int
    #: attempts with an outcome (not still open): the denominator of `retry_rate`
    finished_attempts: int
    #: finished attempts that ended in each failure class, divided by all finished attempts
    #: (a share of attempts, not a retry rate: `permanent` and `unknown` are never retried)
    failure_share: dict[str, float]
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
    #: what customers and the provider said about the week's digests
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

    @property
    def work_items(self) -> int:
        """The week's work items, in every state: `eligible` once the week is enqueued."""
        return sum(self.by_state.values())

    def as_flat_dict(self) -> dict[str, float | int | str | None]:
        """The week's figures under their stable names, rounded once for every reader.

        A state count for every state (they add up to `work_items`); a share as a fraction
        (`*_fraction`, 4 places, for plots) and as text with its base (`*_pct`); durations in
        seconds to 0.1 s. `dead_letters_recorded` counts dead-letter records, which stay when
        an item is replayed; the state `dead_lettered` counts items that are dead-lettered now.
        """
        flat: dict[str, float | int | str | None] = {
            "period": str(self.period),
            "eligible": self.eligible,
            "delivered": self.delivered,
            "delivered_fraction": fraction(self.delivered, self.eligible),
            "delivered_pct": percent_of(self.delivered, self.eligible, "eligible"),
            "work_items": self.work_items,
        }
        flat |= {s: self.by_state.get(s, 0) for s in (st.value for st in DeliveryState)}
        flat |= {"attempts": self.attempts, "finished_attempts": self.finished_attempts}
        for fc in FailureClass:
            share = self.failure_share.get(fc.value, 0.0)
            flat[f"{fc.value}_attempts_fraction"] = round(share, 4)
            flat[f"{fc.value}_attempts_pct"] = rate_of(
                share, self.finished_attempts, "finished attempts"
            )
        flat |= {
            "enqueue_to_claim_p50_s": seconds(self.enqueue_to_claim_p50_s),
            "enqueue_to_claim_p95_s": seconds(self.enqueue_to_claim_p95_s),
            "oldest_pending_age_s": seconds(self.oldest_pending_age_s),
            "duplicates_suppressed": self.duplicates_suppressed,
            "duplicate_sends": self.duplicate_sends,
            "cleanup_lag_p50_s": seconds(self.cleanup_lag_p50_s),
            "cleanup_lag_max_s": seconds(self.cleanup_lag_max_s),
            "dead_letters_recorded": sum(self.dead_letters.values()),
            "unsubscribes": self.feedback.unsubscribes,
            "hard_bounces": self.feedback.hard_bounces,
            "complaints": self.feedback.complaints,
            "complaint_rate": fraction(self.feedback.complaints, self.delivered),
            "complaint_rate_pct": percent_of(self.feedback.complaints, self.delivered, "delivered"),
        }
        return flat


def fraction(part: int, whole: int) -> float | None:
    """`part / whole` rounded to 4 places (0.01 %), for plots; None when there is no base."""
    return round(part / whole, 4) if whole else None


def percent_of(part: int, whole: int, base: str) -> str:
    """`3.1 % of 260 eligible`: a share as a percentage with its denominator."""
    return rate_of(part / whole if whole else 0.0, whole, base)


def rate_of(rate: float, whole: int, base: str) -> str:
    """`rate` (a fraction of `whole`) as `3.1 % of 260 eligible`; `n/a (0 eligible)` for none."""
    if not whole:
        return f"n/a (0 {base})"
    return f"{100 * rate:.1f} % of {whole:,} {base}"


def seconds(value: float | None) -> float | None:
    """A duration in seconds rounded to 0.1 s: the UI prints floats in full."""
    return None if value is None else round(value, 1)


def cleanup_figures(ledger: ReadModel, period: Period) -> dict[str, int | float | None]:
    """The week's figures `digest_cleanup` shows, named and rounded as `as_flat_dict` has them.

    Two reads (the state counts and the item times), not the whole `period_metrics`, whose
    invariant and feedback queries the cleanup step has no use for.
    """
    counts = ledger.state_counts(period)
    sent, cleaned = counts.get(DeliveryState.SENT, 0), counts.get(DeliveryState.CLEANED, 0)
    times = ledger.item_time_summary(period)
    return {
        "delivered": sent + cleaned,
        DeliveryState.SENT.value: sent,
        DeliveryState.CLEANED.value: cleaned,
        "cleanup_lag_p50_s": seconds(times.cleanup_lag_p50_s),
        "cleanup_lag_max_s": seconds(times.cleanup_lag_max_s),
    }


def content_totals(ledger: ContentBacklog, period: Period, eligible: int) -> dict[str, int]:
    """The week's content as the ledger holds it: customers with a digest written, and without.

    `content_customers` have live rows or were already sent (their rows may be cleaned since);
    `content_missing` still need content generated (a catalogue with no picks for them leaves
    them here).
    """
    missing = sum(1 for _ in ledger.iter_needing_content(period))
    return {"content_customers": eligible - missing, "content_missing": missing}


def period_metrics(ledger: PeriodReader, period: Period, now: datetime) -> PeriodMetrics:
    """Computes the period's metrics from the ledger."""
    snapshot = ledger.snapshot(period)
    outcomes = ledger.attempt_outcome_counts(period)
    finished = sum(n for k, n in outcomes.items() if k not in ("open", "duplicate"))
    failure_share = {
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
        failure_share=failure_share,
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
