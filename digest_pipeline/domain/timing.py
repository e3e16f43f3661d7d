"""A period's item timings summed up: the one definition the metrics and the ledgers share.

The metrics need two nearest-rank percentiles of the claim delay, the cleanup lag's median and
maximum, and the oldest waiting item. `summarize_item_times` is the reference, one pass over
the items in Python; a SQL ledger may answer the same numbers in one statement instead
(`ReadModel.item_time_summary`), and the contract tests hold it to this one.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from digest_pipeline.domain.model import ItemTimes
from digest_pipeline.domain.states import CLAIMABLE, DeliveryState

#: the states of an item still waiting to be sent (`oldest_waiting_created_at`)
WAITING = CLAIMABLE | {DeliveryState.CLAIMED}


def percentile_rank(count: int, q: int) -> int:
    """The 1-based nearest rank of percentile `q` (0 to 100) among `count` values (≥ 1).

    Integer arithmetic, so every implementation picks the same rank (a float `0.95 * n` can
    land an ulp above an integer and round one rank up).
    """
    return min(count, max(1, -(-count * q // 100)))


def percentile(values: list[float], q: int) -> float | None:
    """Nearest-rank percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    return sorted(values)[percentile_rank(len(values), q) - 1]


@dataclass(frozen=True)
class ItemTimeSummary:
    """A period's item timings, in seconds; None where no item has the times yet."""

    #: per item: its first claim minus its own enqueue time (never a claim batch's or period's)
    claim_delay_p50_s: float | None
    claim_delay_p95_s: float | None
    #: when the oldest item still waiting to be sent was enqueued
    oldest_waiting_created_at: datetime | None
    #: per cleaned item: its cleanup minus its send
    cleanup_lag_p50_s: float | None
    cleanup_lag_max_s: float | None


def summarize_item_times(times: Iterable[ItemTimes]) -> ItemTimeSummary:
    """One pass over the items; only the numbers stay in memory."""
    claim_delays: list[float] = []
    lags: list[float] = []
    oldest_waiting: datetime | None = None
    for i in times:
        # Each item against its own enqueue time: items claimed together in one wave share a
        # claim time, but not necessarily an enqueue time.
        if i.first_claimed_at is not None:
            claim_delays.append((i.first_claimed_at - i.created_at).total_seconds())
        if i.cleaned_at is not None and i.sent_at is not None:
            lags.append((i.cleaned_at - i.sent_at).total_seconds())
        if i.state in WAITING and (oldest_waiting is None or i.created_at < oldest_waiting):
            oldest_waiting = i.created_at
    return ItemTimeSummary(
        claim_delay_p50_s=percentile(claim_delays, 50),
        claim_delay_p95_s=percentile(claim_delays, 95),
        oldest_waiting_created_at=oldest_waiting,
        cleanup_lag_p50_s=percentile(lags, 50),
        cleanup_lag_max_s=max(lags) if lags else None,
    )
