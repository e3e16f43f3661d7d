"""Retry bounds and the decision after a failed attempt, with an exact random source."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from digest_pipeline.domain.errors import DigestError, InvalidPolicy
from digest_pipeline.domain.failures import FailureClass
from digest_pipeline.domain.retry import (
    DeadLetter,
    DeadLetterReason,
    Decision,
    Fail,
    RandomSource,
    Reconcile,
    RetryAt,
    RetryPolicy,
    decide,
    retry_delay,
    retry_delay_bound,
)

T0 = datetime(2026, 10, 12, 9, 0, tzinfo=UTC)
POLICY = RetryPolicy(
    base=timedelta(seconds=30),
    cap=timedelta(hours=1),
    max_attempts=8,
    max_age=timedelta(hours=24),
)


def fixed(value: float) -> RandomSource:
    """A random source that always returns `value`."""
    return lambda: value


def seconds(value: float) -> timedelta:
    return timedelta(seconds=value)


def decide_with(failure_class: FailureClass, **overrides: Any) -> Decision:
    """`decide` with this module's defaults: one attempt used, window opened at T0, now = T0."""
    kwargs: dict[str, Any] = {
        "budget_used": 1,
        "window_started_at": T0,
        "now": T0,
        "policy": POLICY,
        "rand": fixed(0.5),
    }
    kwargs.update(overrides)
    return decide(failure_class, **kwargs)


# --- the delay bound ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attempt", "bound"),
    [
        (1, seconds(30)),  # the first retry waits at most the base
        (2, seconds(60)),  # each further attempt doubles the bound
        (3, seconds(120)),
        (4, seconds(240)),
        (5, seconds(480)),
        (6, seconds(960)),
        (7, seconds(1920)),
        (8, seconds(3600)),  # 30 s * 2**7 = 3840 s is capped at one hour
        (9, seconds(3600)),  # the bound stays at the cap
        (42, seconds(3600)),  # far past the cap, where naive doubling would overflow timedelta
    ],
)
def test_delay_bound_doubles_then_is_capped(attempt, bound):
    assert retry_delay_bound(attempt, POLICY) == bound


@pytest.mark.parametrize("attempt", [43, 65, 10_000])
def test_delay_bound_stays_at_the_cap_for_very_high_attempts(attempt):
    assert retry_delay_bound(attempt, POLICY) == POLICY.cap


@pytest.mark.parametrize(
    ("attempt", "rand", "delay"),
    [
        (1, 0.0, seconds(0)),  # a draw of 0 retries at once
        (1, 0.5, seconds(15)),  # full jitter: the draw scales the bound
        (3, 0.5, seconds(60)),  # half of the third bound (120 s)
        (3, 0.999, seconds(119.88)),  # just under the bound
        (20, 0.5, seconds(1800)),  # half of the cap
    ],
)
def test_delay_is_the_bound_scaled_by_the_draw(attempt, rand, delay):
    assert retry_delay(attempt, POLICY, fixed(rand)) == delay


@pytest.mark.parametrize("attempt", [0, -1])
def test_delay_bound_rejects_attempt_below_one(attempt):
    with pytest.raises(InvalidPolicy):
        retry_delay_bound(attempt, POLICY)


@pytest.mark.parametrize("attempt", [0, -1])
def test_delay_rejects_attempt_below_one(attempt):
    with pytest.raises(InvalidPolicy):
        retry_delay(attempt, POLICY, fixed(0.5))


# --- policy validation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"base": seconds(0)},  # base must be positive
        {"base": seconds(-1)},  # base must be positive
        {"base": seconds(60), "cap": seconds(30)},  # cap below base
        {"max_attempts": 0},  # at least one attempt
        {"max_attempts": -1},  # at least one attempt
        {"max_age": seconds(0)},  # max age must be positive
        {"max_age": seconds(-1)},  # max age must be positive
    ],
)
def test_out_of_range_retry_policy_is_rejected(fields):
    with pytest.raises(InvalidPolicy):
        RetryPolicy(**fields)


@pytest.mark.parametrize(
    "fields",
    [
        {},  # the defaults
        {"base": seconds(30), "cap": seconds(30)},  # cap equal to base: a constant bound
        {"max_attempts": 1},  # a single attempt, no retries
        {"base": timedelta(microseconds=1)},  # the smallest positive base
    ],
)
def test_in_range_retry_policy_is_accepted(fields):
    RetryPolicy(**fields)


def test_invalid_policy_is_a_digest_error_and_value_error():
    assert issubclass(InvalidPolicy, DigestError)
    assert issubclass(InvalidPolicy, ValueError)


# --- decide: permanent and unknown ----------------------------------------------------------


@pytest.mark.parametrize("budget_used", [1, 8, 100])
def test_permanent_failure_fails_whatever_the_budget(budget_used):
    assert decide_with(FailureClass.PERMANENT, budget_used=budget_used) == Fail()


def test_permanent_failure_reason_is_permanent():
    assert Fail().reason is DeadLetterReason.PERMANENT


@pytest.mark.parametrize("budget_used", [1, 8, 100])
def test_unknown_failure_goes_to_reconciliation_whatever_the_budget(budget_used):
    assert decide_with(FailureClass.UNKNOWN, budget_used=budget_used) == Reconcile()


def test_unknown_failure_goes_to_reconciliation_even_past_max_age():
    decision = decide_with(FailureClass.UNKNOWN, now=T0 + timedelta(days=30))
    assert decision == Reconcile()


# --- decide: transient ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("budget_used", "rand", "delay"),
    [
        (1, 0.5, seconds(15)),  # first failure: half the base
        (1, 0.0, seconds(0)),  # a draw of 0 retries now
        (3, 0.999, seconds(119.88)),  # third failure: just under its 120 s bound
        (7, 0.5, seconds(960)),  # last failure still under the budget of 8
    ],
)
def test_transient_failure_under_budget_retries_after_exact_delay(budget_used, rand, delay):
    decision = decide_with(FailureClass.TRANSIENT, budget_used=budget_used, rand=fixed(rand))
    assert decision == RetryAt(T0 + delay)


@pytest.mark.parametrize(
    "budget_used",
    [
        8,  # exactly at max_attempts
        9,  # beyond it (e.g. the policy was lowered)
    ],
)
def test_transient_failure_at_budget_is_dead_lettered(budget_used):
    decision = decide_with(FailureClass.TRANSIENT, budget_used=budget_used)
    assert decision == DeadLetter(DeadLetterReason.MAX_ATTEMPTS)


def test_transient_retry_beyond_max_age_is_dead_lettered():
    # 23:59:50 after the first attempt, a 15 s delay lands 5 s past the 24 h max age.
    now = T0 + timedelta(hours=23, minutes=59, seconds=50)
    decision = decide_with(FailureClass.TRANSIENT, now=now)
    assert decision == DeadLetter(DeadLetterReason.MAX_AGE)


def test_transient_retry_exactly_at_max_age_is_scheduled():
    now = T0 + timedelta(hours=23, minutes=59, seconds=45)
    decision = decide_with(FailureClass.TRANSIENT, now=now)
    assert decision == RetryAt(T0 + timedelta(hours=24))


def test_transient_retry_at_or_after_delivery_close_is_dead_lettered():
    decision = decide_with(FailureClass.TRANSIENT, delivery_closes_at=T0 + seconds(15))
    assert decision == DeadLetter(DeadLetterReason.WINDOW_CLOSED)


def test_transient_retry_before_delivery_close_is_scheduled():
    decision = decide_with(FailureClass.TRANSIENT, delivery_closes_at=T0 + seconds(16))
    assert decision == RetryAt(T0 + seconds(15))


def test_max_age_takes_precedence_over_closed_window():
    now = T0 + timedelta(hours=23, minutes=59, seconds=50)
    decision = decide_with(FailureClass.TRANSIENT, now=now, delivery_closes_at=now)
    assert decision == DeadLetter(DeadLetterReason.MAX_AGE)


def test_transient_failure_ignores_retry_after():
    decision = decide_with(FailureClass.TRANSIENT, retry_after=timedelta(hours=2))
    assert decision == RetryAt(T0 + seconds(15))


# --- decide: throttled ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("retry_after", "rand", "delay"),
    [
        (seconds(120), 0.0, seconds(120)),  # a draw of 0 waits exactly what the provider asked
        (seconds(120), 0.5, seconds(135)),  # plus up to one base of jitter (here half of 30 s)
        (seconds(120), 0.999, seconds(149.97)),  # never a full base more
        (seconds(1), 0.0, seconds(1)),  # a short Retry-After is honoured as is
    ],
)
def test_throttled_failure_waits_retry_after_plus_jitter(retry_after, rand, delay):
    decision = decide_with(FailureClass.THROTTLED, retry_after=retry_after, rand=fixed(rand))
    assert decision == RetryAt(T0 + delay)


@pytest.mark.parametrize(
    ("budget_used", "retry_after", "delay"),
    [
        (3, None, seconds(120 + 15)),  # no Retry-After: the bound for the budget used, plus jitter
        (3, seconds(0), seconds(120 + 15)),  # a zero Retry-After counts as none
        (3, seconds(-5), seconds(120 + 15)),  # a negative Retry-After counts as none
        (0, None, seconds(30 + 15)),  # no budget used yet: the first bound
    ],
)
def test_throttled_failure_without_usable_retry_after_waits_the_backoff_bound(
    budget_used, retry_after, delay
):
    decision = decide_with(FailureClass.THROTTLED, budget_used=budget_used, retry_after=retry_after)
    assert decision == RetryAt(T0 + delay)


@pytest.mark.parametrize(
    "budget_used",
    [
        8,  # at max_attempts
        50,  # far beyond it: throttled attempts are not counted against the budget
    ],
)
def test_throttled_failure_is_not_dead_lettered_on_max_attempts(budget_used):
    decision = decide_with(FailureClass.THROTTLED, budget_used=budget_used, retry_after=seconds(60))
    assert decision == RetryAt(T0 + seconds(60 + 15))


def test_throttled_retry_beyond_max_age_is_dead_lettered():
    now = T0 + timedelta(hours=23, minutes=58)
    decision = decide_with(FailureClass.THROTTLED, now=now, retry_after=timedelta(minutes=5))
    assert decision == DeadLetter(DeadLetterReason.MAX_AGE)


def test_throttled_retry_after_delivery_close_is_dead_lettered():
    decision = decide_with(
        FailureClass.THROTTLED,
        retry_after=timedelta(minutes=5),
        delivery_closes_at=T0 + timedelta(minutes=5),
    )
    assert decision == DeadLetter(DeadLetterReason.WINDOW_CLOSED)


# --- properties -----------------------------------------------------------------------------

draws = st.floats(min_value=0.0, max_value=1.0, exclude_max=True)


@st.composite
def policies(draw: st.DrawFn) -> RetryPolicy:
    """Any valid policy, with bases from 1 µs to 1 day."""
    base = timedelta(microseconds=draw(st.integers(1, 86_400 * 10**6)))
    return RetryPolicy(
        base=base,
        cap=base + timedelta(microseconds=draw(st.integers(0, 7 * 86_400 * 10**6))),
        max_attempts=draw(st.integers(1, 100)),
        max_age=timedelta(microseconds=draw(st.integers(1, 30 * 86_400 * 10**6))),
    )


@given(attempt=st.integers(1, 10_000), policy=policies(), rand=draws)
@example(attempt=10_000, policy=POLICY, rand=0.5)
def test_delay_is_never_above_the_cap(attempt, policy, rand):
    assert retry_delay(attempt, policy, fixed(rand)) <= policy.cap


@given(attempt=st.integers(1, 10_000), policy=policies(), rand=draws)
@example(attempt=10_000, policy=POLICY, rand=0.0)
def test_delay_is_never_negative(attempt, policy, rand):
    assert retry_delay(attempt, policy, fixed(rand)) >= timedelta(0)


@given(attempt=st.integers(1, 9_999), policy=policies())
@example(attempt=9_999, policy=POLICY)
def test_delay_bound_is_non_decreasing_in_the_attempt(attempt, policy):
    assert retry_delay_bound(attempt, policy) <= retry_delay_bound(attempt + 1, policy)


@st.composite
def decisions(draw: st.DrawFn, failure_class: FailureClass | None = None) -> dict[str, Any]:
    """Keyword arguments for `decide`, plus the failure class under the key `failure_class`.

    Budgets range far past `max_attempts`, because throttled attempts do not spend the budget.
    """
    base = timedelta(microseconds=draw(st.integers(1, 3_600 * 10**6)))
    policy = RetryPolicy(
        base=base,
        cap=base + timedelta(seconds=draw(st.integers(0, 86_400))),
        max_attempts=draw(st.integers(1, 20)),
        max_age=timedelta(seconds=draw(st.integers(1, 7 * 86_400))),
    )
    window_started_at = T0 + timedelta(seconds=draw(st.integers(0, 365 * 86_400)))
    now = window_started_at + timedelta(
        microseconds=draw(st.integers(0, 2 * policy.max_age // timedelta(microseconds=1)))
    )
    retry_after = draw(
        st.none() | st.integers(-3_600, 3 * 86_400).map(lambda s: timedelta(seconds=s))
    )
    delivery_closes_at = draw(
        st.none() | st.integers(-86_400, 7 * 86_400).map(lambda s: now + timedelta(seconds=s))
    )
    return {
        "failure_class": (
            draw(st.sampled_from(FailureClass)) if failure_class is None else failure_class
        ),
        "budget_used": draw(st.integers(1, 10_000)),
        "window_started_at": window_started_at,
        "now": now,
        "policy": policy,
        "rand": fixed(draw(draws)),
        "retry_after": retry_after,
        "delivery_closes_at": delivery_closes_at,
    }


def run(kwargs: dict[str, Any]) -> Decision:
    args = dict(kwargs)
    return decide(args.pop("failure_class"), **args)


@given(kwargs=decisions())
def test_scheduled_retry_is_never_after_max_age(kwargs):
    decision = run(kwargs)
    if isinstance(decision, RetryAt):
        assert decision.at <= kwargs["window_started_at"] + kwargs["policy"].max_age


@given(kwargs=decisions())
def test_scheduled_retry_is_never_in_the_past(kwargs):
    decision = run(kwargs)
    if isinstance(decision, RetryAt):
        assert decision.at >= kwargs["now"]


@given(kwargs=decisions(FailureClass.THROTTLED))
def test_throttled_retry_is_never_earlier_than_retry_after(kwargs):
    decision = run(kwargs)
    retry_after = kwargs["retry_after"]
    if isinstance(decision, RetryAt) and retry_after is not None:
        assert decision.at >= kwargs["now"] + retry_after


@given(kwargs=decisions())
def test_scheduled_retry_is_before_the_delivery_window_closes(kwargs):
    decision = run(kwargs)
    closes_at = kwargs["delivery_closes_at"]
    if isinstance(decision, RetryAt) and closes_at is not None:
        assert decision.at < closes_at


@given(kwargs=decisions(FailureClass.TRANSIENT))
def test_transient_failure_at_or_over_budget_is_always_dead_lettered(kwargs):
    if kwargs["budget_used"] >= kwargs["policy"].max_attempts:
        assert run(kwargs) == DeadLetter(DeadLetterReason.MAX_ATTEMPTS)


@given(kwargs=decisions(FailureClass.PERMANENT))
def test_permanent_failure_always_fails(kwargs):
    assert run(kwargs) == Fail()


@given(kwargs=decisions(FailureClass.UNKNOWN))
def test_unknown_failure_always_goes_to_reconciliation(kwargs):
    assert run(kwargs) == Reconcile()
