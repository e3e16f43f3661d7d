"""The delivery bounds beyond retries: lease, delivery window, late window, unknown retention.

Each is configuration; the README justifies the defaults from the simulator's numbers. A week
never attempted before its window closed is refused, not dead-lettered in silence, unless an
operator granted it a late window (`late_refusal`).
"""

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from digest_pipeline.domain.errors import InvalidPolicy
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.retry import RetryPolicy

#: `DIGEST_SEND_RATE`'s bounds (messages per second). Above the most, a ledger statement per
#: send costs more than the pace saves; below the least, a single send's slot would be further
#: off than a started attempt may wait for it (domain/pacing.py `MAX_WAIT`).
MIN_SEND_RATE = 0.1
MAX_SEND_RATE = 10_000.0


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
    #: how long an operator's late-delivery grant keeps a missed week's window open
    late_window: timedelta = timedelta(days=1)
    #: messages per second for every sender of the install together (`DIGEST_SEND_RATE`,
    #: domain/pacing.py); None: unpaced, a provider's pause is still honoured
    send_rate: float | None = None

    def __post_init__(self) -> None:
        for name in ("lease", "delivery_window", "unknown_retention", "late_window"):
            if getattr(self, name) <= timedelta(0):
                raise InvalidPolicy(f"{name} must be positive")
        if self.send_rate is not None and not MIN_SEND_RATE <= self.send_rate <= MAX_SEND_RATE:
            raise InvalidPolicy(
                f"send rate must be from {MIN_SEND_RATE:g} to {MAX_SEND_RATE:g} messages a second"
            )

    def closes_at(self, period: Period, late_since: datetime | None = None) -> datetime:
        """When automatic delivery of the period stops; only a replay sends after this.

        An operator's late grant at `late_since` keeps it open for `late_window` from then.
        """
        closes = period.ends_at + self.delivery_window
        if late_since is None:
            return closes
        return max(closes, late_since + self.late_window)

    def late_refusal(
        self, period: Period, now: datetime, attempted: bool, late_since: datetime | None
    ) -> str | None:
        """Why a run of the period must not start now, or None when it may.

        A week whose window closed before any digest of it was attempted is a missed week: a
        run would dead-letter every item `window_closed` and look green, so it is refused until
        an operator grants a late window. A week that was attempted in time keeps its normal
        behaviour (what is left after the window is dead-lettered, visibly).
        """
        closes = self.closes_at(period, late_since)
        if attempted or now < closes:
            return None
        lapsed = "its late window" if late_since is not None else "its delivery window"
        return (
            f"period {period}: {lapsed} closed at {closes:%Y-%m-%d %H:%M} UTC before any digest "
            f"was attempted; nothing was recorded (to send it late: digest run --period {period} "
            "--deliver-late --reason TEXT, or a run tagged digest/deliver_late=REASON and "
            "digest/operator=NAME)"
        )
