"""A relay's permanent refusal of the mailbox suppresses the customer; other refusals do not.

The digest of a customer whose mailbox does not exist (SMTP 5.1.1, …) fails `permanent`, and the
customer goes on the suppression list as `hard_bounce`: next week's snapshot leaves them out and
their other weeks' items whose attempt has not started end `suppressed`. A policy refusal, a
refusal without an enhanced code and a temporary one suppress nobody.
"""

from datetime import timedelta

import pytest

from digest_pipeline.domain.bounces import hard_bounce
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.feedback import SuppressionReason
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline_tests.builders import (
    deliver_all,
    failed_invariants,
    key_of,
    make_deliverer,
    seed_period,
    state_of,
)
from digest_pipeline_tests.conftest import T0, W42
from digest_pipeline_tests.fakes import FakeMailer

W43 = Period(2026, 43)


def _failed(detail: str, cls: FailureClass = FailureClass.PERMANENT) -> SendOutcome:
    return SendOutcome.failed(cls, detail)


@pytest.mark.parametrize(
    ("outcome", "suppresses"),
    [
        (_failed("smtp:550:5.1.1"), True),  # no such mailbox
        (_failed("smtp:550:5.1.2"), True),  # no such domain
        (_failed("smtp:553:5.1.3"), True),  # bad address syntax
        (_failed("smtp:551:5.1.6"), True),  # mailbox moved, no forwarding
        (_failed("smtp:556:5.1.10"), True),  # the domain takes no mail (null MX)
        (_failed("smtp:550:5.2.1"), True),  # mailbox disabled
        (_failed("smtp:550:5.7.1"), False),  # policy: spam, reputation, relaying
        (_failed("smtp:550"), False),  # no enhanced code: often policy, left to the operator
        (_failed("smtp:553:5.1.7"), False),  # the sender's address, not the recipient's
        (_failed("smtp:550:5.1.11"), False),  # not a code RFC 3463 or 7505 defines
        (_failed("smtp:450:4.2.1", FailureClass.TRANSIENT), False),  # may pass
        (_failed("http:422"), False),  # the provider's own bounce comes as its event
        (SendOutcome.sent("pm-1"), False),
    ],
)
def test_only_a_permanent_refusal_of_the_mailbox_is_a_hard_bounce(outcome, suppresses):
    found = hard_bounce("customer-0001", outcome, T0)

    assert (found is not None) is suppresses
    if found is not None:
        assert (found.customer_id, found.reason) == ("customer-0001", SuppressionReason.HARD_BOUNCE)
        assert found.source == f"mailer:{outcome.detail}"


def test_a_hard_bounce_suppresses_the_customer_and_their_unsent_weeks(ledger, clock):
    seed_period(ledger, 3, now=clock.now())
    seed_period(ledger, 3, period=W43, now=clock.now())
    mailer = FakeMailer(clock=clock)
    mailer.script(key_of(1), _failed("smtp:550:5.1.1"))
    mailer.script(key_of(2), _failed("smtp:550:5.7.1"))

    deliver_all(make_deliverer(ledger, mailer, clock), period=W42)

    assert state_of(ledger, key_of(1)) is DeliveryState.FAILED
    assert state_of(ledger, key_of(2)) is DeliveryState.FAILED
    [suppression] = ledger.suppressions()
    assert (suppression.customer_id, suppression.reason, suppression.source) == (
        key_of(1).customer_id,
        SuppressionReason.HARD_BOUNCE,
        "mailer:smtp:550:5.1.1",
    )
    assert {i.key: i.state for i in ledger.items(W43)} == {
        key_of(1, W43): DeliveryState.SUPPRESSED,
        key_of(2, W43): DeliveryState.PENDING,
        key_of(3, W43): DeliveryState.PENDING,
    }
    clock.advance(timedelta(minutes=1))
    deliver_all(make_deliverer(ledger, mailer, clock), period=W43)
    assert mailer.deliveries_for(key_of(1, W43)) == 0
    assert failed_invariants(ledger, W42, clock.now()) == []
    assert failed_invariants(ledger, W43, clock.now()) == []
