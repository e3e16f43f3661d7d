"""The chaos run's week stays deliverable for the whole run, whatever the hour it starts.

Its week is the latest complete one, whose default window closes when the current week ends; a
run started late on a Sunday would see the window close half way and dead-letter the rest.
"""

from datetime import UTC, datetime, timedelta

from digest_pipeline.rigs.chaos.harness import chaos_period
from digest_pipeline.rigs.chaos.settings import LONG, SHORT
from digest_pipeline.rigs.chaos.worker import parse_args, policy_of

ARGS = [
    "--index", "0", "--period", "2026-W48",
    "--provider-url", "http://127.0.0.1:1", "--seed", "1", "--lease-seconds", "5",
    "--retry-base-seconds", "0.1", "--retry-cap-seconds", "1", "--max-attempts", "3",
    "--batch-size", "10", "--concurrency", "2", "--pass-items", "10", "--deadline-seconds", "60",
]  # fmt: skip


def test_the_week_is_open_from_start_to_deadline_at_every_minute_of_the_week():
    policy = policy_of(parse_args(ARGS))
    monday = datetime(2026, 11, 30, tzinfo=UTC)
    longest = timedelta(seconds=max(SHORT.timeout_seconds, LONG.timeout_seconds))
    for minutes in range(0, 7 * 24 * 60, 7):
        start = monday + timedelta(minutes=minutes)
        period = chaos_period(start)
        assert period.ends_at <= start, start  # a complete week
        assert policy.closes_at(period) > start + longest, start
