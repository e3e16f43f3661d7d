"""The period's item timings: every ledger gives the numbers of the Python reference.

`domain.timing.summarize_item_times` is the definition; the SQL ledger answers in one
statement, with each database's own percentile ranks and interval arithmetic (SQLite's from the
stored text, to the microsecond), so all are held to it on times with microseconds, ties and
states that count as waiting or not.
"""

from datetime import timedelta

import pytest

from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import CleanupMode
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.domain.timing import ItemTimeSummary, summarize_item_times
from digest_pipeline_tests.builders import clean_one
from digest_pipeline_tests.conftest import T0, W42
from digest_pipeline_tests.contract.ledger_steps import LEASE, W43, frozen, send


def _at(seconds: float) -> timedelta:
    return timedelta(microseconds=round(seconds * 1_000_000))


def _a_varied_week(ledger, claimed: int) -> None:
    """`claimed` + 4 of the period's items claimed, most at distinct times (one rank off is
    another value), four together (a tie); some sent, some of those cleaned, some failed."""
    frozen(ledger, claimed + 10)
    frozen(ledger, 5, W43)  # another week's items never count
    claims = [
        claim
        for n in range(claimed)
        for claim in ledger.claim_due(T0 + _at(1.5 + 0.731 * n + n % 3 / 1e6), "w", LEASE, 1, W42)
    ]
    claims += ledger.claim_due(T0 + _at(99.25), "w", LEASE, 4, W42)
    for n, claim in enumerate(claims):
        sent_at = T0 + _at(120 + 0.3 * n)
        if n % 5 == 4:
            failure = SendOutcome.failed(FailureClass.PERMANENT, "smtp:550")
            send(ledger, claim, failure, DeliveryState.FAILED, sent_at)
            continue
        send(ledger, claim, SendOutcome.sent(f"pm-{claim.key}"), DeliveryState.SENT, sent_at)
        if n % 2 == 0:
            later = sent_at + _at(60 + 7.7 * n)
            clean_one(ledger, claim.key, claim.token, CleanupMode.ARCHIVE, later)
    # one claimed and left claimed: it counts as waiting, as the pending ones do
    ledger.claim_due(T0 + _at(300), "w9", LEASE, 1, W42)


@pytest.mark.parametrize("claimed", [16, 17, 36, 57])
def test_the_summary_is_the_reference_pass_over_the_items(ledger, claimed):
    _a_varied_week(ledger, claimed)

    summary = ledger.item_time_summary(W42)

    assert summary == summarize_item_times(ledger.iter_item_times(W42))
    assert summary.claim_delay_p50_s is not None
    assert summary.cleanup_lag_max_s is not None
    assert summary.oldest_waiting_created_at == T0


def test_a_week_with_no_claims_has_no_timings(ledger):
    frozen(ledger, 3)

    assert ledger.item_time_summary(W42) == ItemTimeSummary(None, None, T0, None, None)
    assert ledger.item_time_summary(W43) == ItemTimeSummary(None, None, None, None, None)
