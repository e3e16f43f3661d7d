"""The delivery bounds beyond retries: lease, delivery window and unknown retention.

Defaults are provisional until the simulator (issue 6) measures them; each is configuration.
"""

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from digest_pipeline.domain.errors import InvalidPolicy
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.retry import RetryPolicy


@dataclass(frozen=True)
class DeliveryPolicy:
    """Every bound the delivery gate applies, in one value passed to the services."""

    retry: RetryPolicy = field(default_factory=RetryPolicy)
    #: the visibility timeout: a claim not finished by then is recovered by the sweep
    lease: timedelta = timedelta(minutes=2)
    #: how long after a period ends its digest is still worth sending: by default until the
    #: next period's digest is due, so the latest complete week can be run on any day
    delivery_window: timedelta = timedelta(days=7)
    #: how long an `unknown` item may wait for reconciliation before it is dead-lettered
    unknown_retention: timedelta = timedelta(days=7)

    def __post_init__(self) -> None:
        for name in ("lease", "delivery_window", "unknown_retention"):
            if getattr(self, name) <= timedelta(0):
                raise InvalidPolicy(f"{name} must be positive")

    def closes_at(self, period: Period) -> datetime:
        """When automatic delivery of the period stops; only a replay sends after this."""
        return period.ends_at + self.delivery_window
