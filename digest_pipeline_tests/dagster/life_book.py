"""What the eight-week life test scripts and expects: each customer's role, each week's book of changes."""

import enum
from dataclasses import dataclass, field
from datetime import timedelta

from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline_tests.fakes import FakeMailer

#: eight consecutive complete weeks (a partition must be a completed week in real time)
WEEKS = tuple(Period(2026, w) for w in range(36, 44))
CUSTOMERS, SEED = 48, 4
MAX_ATTEMPTS = 4
UNKNOWN_RETENTION = timedelta(days=7)
#: the sweeper's ticks after the schedule's: three a little past the retry cap (1 h), so every
#: scheduled retry is due at each (the longest scripted chain is three retries); one past the
#: provider's 24 h idempotency window (a resend is no longer safe: back to `unknown`); one that
#: looks at that `unknown` item once more (its fencing token changed); one that finds nothing new
SWEEP_GAPS = (
    *(timedelta(minutes=65),) * 3,
    timedelta(hours=24),
    timedelta(hours=24),
    timedelta(hours=48),
)
#: ERROR checks every schedule run must evaluate (others may be added; they are asserted too)
INVARIANT_CHECKS = {
    "snapshot_unchanged",
    "no_silent_timeout",
    "every_customer_has_visible_state",
    "no_duplicate_send",
    "at_most_one_cleanup_per_key",
}


class Role(enum.Enum):
    """What the provider does with a customer's digest this week."""

    #: delivered on the first try
    PLAIN = "plain"
    #: `failures` transient failures (HTTP 503), then delivered
    TRANSIENT = "transient"
    #: one 429, then delivered
    THROTTLED = "throttled"
    #: transient on every attempt: dead-lettered `max_attempts`
    EXHAUSTED = "exhausted"
    #: the provider accepts, the caller times out; resent inside the window, deduplicated
    ACCEPTED_TIMEOUT = "accepted_timeout"
    #: the caller times out before the provider got it; resent inside the window, delivered
    LOST_TIMEOUT = "lost_timeout"
    #: accepted, and every answer lost, past the provider's idempotency window: stays `unknown`
    STUCK_UNKNOWN = "stuck_unknown"
    #: an address the composer refuses: `failed`, never sent
    INVALID = "invalid"


@dataclass(frozen=True)
class Week:
    """One week's script: the shop's changes before its tick, the provider's faults, the operator."""

    transient: tuple[int, ...] = ()
    throttled: int = 0
    exhausted: int = 0
    accepted_timeout: int = 0
    lost_timeout: int = 0
    stuck_unknown: int = 0
    # -- the shop, between last week's digest and this week's tick
    opt_out: int = 0
    deactivate: int = 0
    readdress: int = 0
    opt_in: int = 0
    sign_up: int = 0
    fix_invalid: int = 0
    # -- the shop, after this week's freeze, for customers whose digest is still retrying
    readdress_retrying: int = 0
    deactivate_retrying: int = 0
    #: an operator re-materialises this week's partition once its sweeps are done
    rematerialise: bool = False


PLAN = (
    Week(transient=(1,)),
    Week(
        transient=(1, 2),
        accepted_timeout=1,
        lost_timeout=1,
        readdress_retrying=1,
        opt_out=1,
        deactivate=1,
        readdress=1,
    ),
    Week(exhausted=1, throttled=1, transient=(3,), deactivate_retrying=1, opt_in=1, sign_up=2),
    Week(stuck_unknown=1, transient=(1,), opt_out=1, readdress=1),
    Week(accepted_timeout=2, transient=(2, 2), fix_invalid=1, deactivate=1, rematerialise=True),
    # a bad provider day: many transient failures at once
    Week(transient=(1, 1, 1, 1, 1, 1, 2, 2, 2), opt_out=1, sign_up=1),
    Week(lost_timeout=1, throttled=2, readdress=1, deactivate=1),
    Week(),
)
assert len(PLAN) == len(WEEKS)


@dataclass(frozen=True)
class Expected:
    """What a key's week must end with; `None` counts mean "as many as it took"."""

    role: Role
    state: DeliveryState
    deliveries: int
    attempts: int | None
    sends: int | None
    dead_letter: str | None = None


def expected_for(role: Role, failures: int = 0) -> Expected:
    match role:
        case Role.PLAIN:
            return Expected(role, DeliveryState.CLEANED, 1, 1, 1)
        case Role.TRANSIENT:
            return Expected(role, DeliveryState.CLEANED, 1, failures + 1, failures + 1)
        case Role.THROTTLED | Role.ACCEPTED_TIMEOUT | Role.LOST_TIMEOUT:
            return Expected(role, DeliveryState.CLEANED, 1, 2, 2)
        case Role.EXHAUSTED:
            return Expected(
                role, DeliveryState.DEAD_LETTERED, 0, MAX_ATTEMPTS, MAX_ATTEMPTS, "max_attempts"
            )
        case Role.STUCK_UNKNOWN:
            return Expected(role, DeliveryState.UNKNOWN, 1, None, None)
        case Role.INVALID:
            # the composer refuses it after the attempt is recorded, before any provider call
            return Expected(role, DeliveryState.FAILED, 0, 1, 0, "permanent")
    raise AssertionError(role)


def script(mailer: FakeMailer, key: OperationKey, role: Role, failures: int) -> None:
    transient = SendOutcome.failed(FailureClass.TRANSIENT, "http:503")
    match role:
        case Role.TRANSIENT:
            mailer.script(key, *[transient] * failures)
        case Role.EXHAUSTED:
            mailer.script(key, *[transient] * MAX_ATTEMPTS)
        case Role.THROTTLED:
            # without a Retry-After: one with a wait pauses every sender of the install until
            # then (services/test_pacing.py), which this test's frozen clock would never end
            throttled = SendOutcome.failed(FailureClass.THROTTLED, "http:429")
            mailer.script(key, throttled)
        case Role.ACCEPTED_TIMEOUT:
            mailer.script(key, FakeMailer.ACCEPTED_THEN_TIMEOUT)
        case Role.LOST_TIMEOUT:
            mailer.script(key, SendOutcome.failed(FailureClass.UNKNOWN, "http:read_timeout"))
        case Role.STUCK_UNKNOWN:
            mailer.script(key, *[FakeMailer.ACCEPTED_THEN_TIMEOUT] * 20)
        case Role.PLAIN | Role.INVALID:
            pass


@dataclass
class Book:
    """What the test expects of every key of every week so far, and what it has seen."""

    expected: dict[OperationKey, Expected] = field(default_factory=dict)
    frozen: dict[Period, dict[str, str]] = field(default_factory=dict)
    #: customers changed after their week's freeze: (period, customer id) -> what changed
    moved_mid_week: dict[tuple[Period, str], str] = field(default_factory=dict)
    rows: list[dict[str, object]] = field(default_factory=list)

    def of(self, period: Period) -> dict[OperationKey, Expected]:
        return {k: e for k, e in self.expected.items() if k.period == period}


@dataclass
class Changes:
    """The shop changes made before one week's tick, by customer id."""

    left: set[str] = field(default_factory=set)
    readdressed: dict[str, str] = field(default_factory=dict)
    joined: set[str] = field(default_factory=set)

    def summary(self) -> str:
        parts = [f"-{len(self.left)}", f"+{len(self.joined)}", f"~{len(self.readdressed)}"]
        return " ".join(parts)
