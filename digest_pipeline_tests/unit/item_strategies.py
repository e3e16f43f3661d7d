"""Hypothesis strategies for claimed items, their attempts' histories and send outcomes."""

from datetime import timedelta

from hypothesis import strategies as st

from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import Attempt, Claim, WorkItem
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.reconciliation import NOT_ACCEPTED
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline_tests.builders import key_of
from digest_pipeline_tests.conftest import T0

POLICY = DeliveryPolicy()
#: the mailer the attempts of the generated histories were made through
MAILER = "smtp:0123456789abcdef"
offsets = st.integers(min_value=-10 * 86_400, max_value=10 * 86_400).map(
    lambda s: timedelta(seconds=s)
)
maybe_offsets = st.none() | offsets


@st.composite
def claims(draw: st.DrawFn) -> Claim:
    item = WorkItem(
        key_of(draw(st.integers(1, 50))),
        DeliveryState.CLAIMED,
        created_at=T0 - timedelta(days=1),
        next_attempt_at=None,
        attempts=draw(st.integers(0, 12)),
        budget_used=draw(st.integers(0, 12)),
        window_started_at=None if (w := draw(maybe_offsets)) is None else T0 + w,
        first_attempt_at=T0 - timedelta(hours=1),
        dedupe_until=None if (d := draw(maybe_offsets)) is None else T0 + d,
        replayed_at=T0 if draw(st.booleans()) else None,
        lease_token=(token := draw(st.integers(1, 9))),
    )
    return Claim(item, token, "w", T0 + POLICY.lease)


outcomes = st.one_of(
    st.builds(SendOutcome.sent, st.text(min_size=1, max_size=8)),
    st.builds(
        SendOutcome.failed,
        st.sampled_from(FailureClass),
        st.text(max_size=8),
        retry_after=st.none() | st.integers(0, 7_200).map(lambda s: timedelta(seconds=s)),
    ),
)


outcome_labels = st.sampled_from([None, "sent", *sorted(NOT_ACCEPTED), FailureClass.UNKNOWN.value])


@st.composite
def histories(draw: st.DrawFn, mailers: st.SearchStrategy[str] | None = None) -> list[Attempt]:
    """Up to four attempts, made through `MAILER` unless `mailers` draws another."""
    labels = draw(st.lists(outcome_labels, max_size=4))
    mailer = MAILER if mailers is None else draw(mailers)
    return [
        Attempt(
            i,
            key_of(1),
            i,
            i,
            "w",
            T0,
            None if o is None else T0,
            o,
            None,
            f"pm-{i}",
            False,
            mailer,
        )
        for i, o in enumerate(labels, 1)
    ]
