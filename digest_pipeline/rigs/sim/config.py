"""What one simulation runs: the failure mix, the bounds under test and the grid to sweep.

Every value is checked here, so the `digest simulate` command and the tests get the same
one-line errors. A grid cell varies only the worker count, the lease and (with `--no-jitter`)
the jitter; everything else is fixed across the grid.
"""

import dataclasses
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from digest_pipeline.domain.errors import DigestError
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.policy import DeliveryPolicy

#: the simulated period and the moment its delivery starts (the Monday 06:00 UTC after it); fixed,
#: so that the numbers never depend on today's date
PERIOD = Period(2026, 42)
START = datetime(2026, 10, 19, 6, 0, tzinfo=UTC)
MAX_CUSTOMERS = 1_000_000


class InvalidSimulation(DigestError, ValueError):
    """A simulation input is out of range; the message names the flag."""


def _rate(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise InvalidSimulation(f"--{name} must be between 0 and 1, got {value:g}")


@dataclass(frozen=True)
class FaultMix:
    """The provider's behaviour: per-send failure rates, a correlated outage and crash points.

    Per-send rates are drawn once per (operation key, send number), so the same key meets the
    same fault on its n-th send in every grid cell. `permanent_rate` is per key: a suppressed
    recipient stays suppressed.
    """

    transient_rate: float = 0.05
    throttle_rate: float = 0.01
    permanent_rate: float = 0.005
    timeout_after_accept_rate: float = 0.005
    crash_after_send_rate: float = 0.005
    crash_after_cleanup_commit_rate: float = 0.005
    duplicate_delivery_rate: float = 0.005
    #: when the outage begins, after the delivery starts; every send inside it is refused
    outage_start: timedelta = timedelta(minutes=40)
    outage_length: timedelta = timedelta(minutes=30)
    provider_idempotent: bool = True
    #: how long the provider takes to answer a send it processes
    send_latency: timedelta = timedelta(milliseconds=200)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if f.name.endswith("_rate"):
                _rate(f.name.replace("_", "-"), getattr(self, f.name))
        per_send = (
            self.transient_rate
            + self.throttle_rate
            + self.timeout_after_accept_rate
            + self.crash_after_send_rate
        )
        if per_send > 1.0:
            raise InvalidSimulation(
                "--transient-rate, --throttle-rate, --timeout-after-accept-rate and "
                f"--crash-after-send-rate add up to {per_send:g}; they share one send, so at most 1"
            )
        if self.outage_start < timedelta(0):
            raise InvalidSimulation("--outage-start must be 0 or more minutes")
        if self.outage_length < timedelta(0):
            raise InvalidSimulation("--outage-minutes must be 0 or more")
        if self.send_latency <= timedelta(0):
            raise InvalidSimulation("--send-latency-ms must be positive")

    def in_outage(self, elapsed: timedelta) -> bool:
        """Whether a send `elapsed` after the start falls inside the outage."""
        return self.outage_start <= elapsed < self.outage_start + self.outage_length


@dataclass(frozen=True)
class Cell:
    """One point of the grid: how many workers, which lease, and whether retries are jittered."""

    no_jitter: bool
    workers: int
    lease_seconds: int

    @property
    def jitter(self) -> bool:
        return not self.no_jitter

    @property
    def label(self) -> str:
        """`w4/l30` (`w4/l30/nj` without jitter): a column heading and a seed component."""
        return f"w{self.workers}/l{self.lease_seconds}" + ("/nj" if self.no_jitter else "")


@dataclass(frozen=True)
class SimConfig:
    """A whole `digest simulate` run: the period's size, the faults, the bounds and the grid."""

    customers: int
    seed: int = 7
    faults: FaultMix = field(default_factory=FaultMix)
    #: the bounds under test; each cell replaces only the lease
    policy: DeliveryPolicy = field(default_factory=DeliveryPolicy)
    #: claims per `claim_due` call of one worker, which then sends them one after another
    batch_size: int = 32
    #: how often the sweep reconciles `unknown` items and cleans `sent` ones
    sweep_interval: timedelta = timedelta(minutes=5)
    workers: tuple[int, ...] = (1, 4, 16)
    lease_seconds: tuple[int, ...] = (5, 30, 120)
    #: also run every cell without jitter (`--no-jitter`), side by side
    compare_no_jitter: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.customers <= MAX_CUSTOMERS:
            raise InvalidSimulation(f"--customers must be between 1 and {MAX_CUSTOMERS}")
        if self.batch_size < 1:
            raise InvalidSimulation("--batch-size must be at least 1")
        if self.sweep_interval <= timedelta(0):
            raise InvalidSimulation("--sweep-seconds must be positive")
        for flag, values in (("--workers", self.workers), ("--lease-seconds", self.lease_seconds)):
            if not values or any(v < 1 for v in values):
                raise InvalidSimulation(f"{flag} must list whole numbers of at least 1")
            if len(set(values)) != len(values):
                raise InvalidSimulation(f"{flag} lists a value twice")

    def cells(self) -> list[Cell]:
        """The grid in output order: jittered first, then by workers, then by lease."""
        jitter = (False, True) if self.compare_no_jitter else (False,)
        return [
            Cell(nj, w, lease)
            for nj in jitter
            for w in self.workers
            for lease in self.lease_seconds
        ]

    def policy_for(self, cell: Cell) -> DeliveryPolicy:
        return dataclasses.replace(self.policy, lease=timedelta(seconds=cell.lease_seconds))

    def describe(self) -> dict[str, object]:
        """The inputs as plain values, for the JSON file and the header above the table."""
        f, r = self.faults, self.policy.retry
        return {
            "customers": self.customers,
            "seed": self.seed,
            "period": str(PERIOD),
            "start": START.isoformat(),
            "transient_rate": f.transient_rate,
            "throttle_rate": f.throttle_rate,
            "permanent_rate": f.permanent_rate,
            "timeout_after_accept_rate": f.timeout_after_accept_rate,
            "crash_after_send_rate": f.crash_after_send_rate,
            "crash_after_cleanup_commit_rate": f.crash_after_cleanup_commit_rate,
            "duplicate_delivery_rate": f.duplicate_delivery_rate,
            "outage_start_min": f.outage_start.total_seconds() / 60,
            "outage_min": f.outage_length.total_seconds() / 60,
            "provider_idempotent": f.provider_idempotent,
            "send_latency_ms": f.send_latency.total_seconds() * 1000,
            "retry_base_s": r.base.total_seconds(),
            "retry_cap_s": r.cap.total_seconds(),
            "max_attempts": r.max_attempts,
            "max_age_s": r.max_age.total_seconds(),
            "batch_size": self.batch_size,
            "sweep_s": self.sweep_interval.total_seconds(),
            "workers": list(self.workers),
            "lease_seconds": list(self.lease_seconds),
            "no_jitter_too": self.compare_no_jitter,
        }
