"""A customer's bad address fails that customer's digest as `invalid_recipient`, and only that.

Delivery renders with the real Jinja2 composer, whose address check refuses the typos a
customer list really holds. The breaker counts consecutive failures with the same code
(domain/breaker.py), so a list with many bad addresses in a row must still be delivered to
everyone else, while a product that breaks every digest (`render_error`) still stops the run.
"""

import pytest

from digest_pipeline.adapters.mail.render import Jinja2Composer
from digest_pipeline.domain.errors import BreakerOpen
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import DigestRow, SnapshotEntry
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.services.deliver import deliver_due
from digest_pipeline.services.wave import DeliveryReport
from digest_pipeline_tests.builders import (
    SHOP_POSTAL_ADDRESS,
    SHOP_UNSUBSCRIBE_URL,
    customer_id,
    digest_rows_for,
    email_of,
    key_of,
    make_deliverer,
)
from digest_pipeline_tests.conftest import T0, W42
from digest_pipeline_tests.fakes import FakeLedger, FakeMailer, FixedClock, SystemicFailureMailer

# every test here on both delivery loops: a provider's pool and a local mailer's ledger thread
pytestmark = pytest.mark.usefixtures("both_mailer_kinds")

THRESHOLD = 20
#: typos people really make, each one the composer refuses as the customer's address
TYPOS = (
    "shopper.{n:04d}.mailbox.example",  # no @
    "shopper.{n:04d}@@mailbox.example",  # doubled @
    "shopper {n:04d}@mailbox.example",  # a space
    "Shopper <shopper.{n:04d}@mailbox.example>",  # a display name
    "shopper.{n:04d}@mailbox,example",  # comma for dot
)
#: a link the composer refuses: the product broke the digest, not the address
BAD_LINK = "javascript:alert(1)"


def typo(n: int) -> str:
    return TYPOS[n % len(TYPOS)].format(n=n)


def week(addresses: dict[int, str], *, bad_link_for: frozenset[int] = frozenset()) -> FakeLedger:
    """A frozen, enqueued W42 of customers 1..len(addresses), at those addresses."""
    ledger = FakeLedger()
    entries = [SnapshotEntry(customer_id(n), a) for n, a in addresses.items()]
    ledger.freeze_snapshot(W42, "run-snapshot", T0, entries)
    ledger.add_digest_rows(row for n in addresses for row in rows(n, bad_link=n in bad_link_for))
    ledger.enqueue(W42, T0)
    return ledger


def rows(n: int, *, bad_link: bool) -> list[DigestRow]:
    made = digest_rows_for(key_of(n), n)
    if not bad_link:
        return made
    return [DigestRow(r.key, r.position, r.payload | {"url": BAD_LINK}) for r in made]


def composer(clock: FixedClock) -> Jinja2Composer:
    return Jinja2Composer(
        sender="digest@shop.example",
        unsubscribe_url=SHOP_UNSUBSCRIBE_URL,
        unsubscribe_secret="a-long-enough-secret-for-these-links",
        clock=clock,
        postal_address=SHOP_POSTAL_ADDRESS,
    )


def deliver(ledger: FakeLedger, mailer, clock: FixedClock, **kwargs) -> DeliveryReport:
    return deliver_due(
        make_deliverer(ledger, mailer, clock, composer=composer(clock)),
        batch_size=50,
        concurrency=4,
        period=W42,
        breaker_threshold=THRESHOLD,
        **kwargs,
    )


def recorded(ledger: FakeLedger) -> dict[str, tuple[DeliveryState, str | None]]:
    return {i.customer_id: (i.state, i.last_detail) for i in ledger.items(W42)}


def test_a_bad_address_fails_as_invalid_recipient_and_a_bad_link_as_render_error(clock):
    ledger = week({1: email_of(1), 2: typo(2), 3: email_of(3)}, bad_link_for=frozenset({3}))

    deliver(ledger, FakeMailer(clock=clock), clock)

    assert recorded(ledger) == {
        customer_id(1): (DeliveryState.SENT, None),
        customer_id(2): (DeliveryState.FAILED, "invalid_recipient"),
        customer_id(3): (DeliveryState.FAILED, "render_error"),
    }


def test_a_run_of_bad_addresses_far_past_the_threshold_never_stops_the_run(clock):
    # 60 bad addresses in a row, then good ones: three times the breaker's threshold
    addresses = {n: typo(n) if n <= 3 * THRESHOLD else email_of(n) for n in range(1, 81)}
    ledger = week(addresses)

    report = deliver(ledger, FakeMailer(clock=clock), clock)

    assert report.outcomes["failed"] == 3 * THRESHOLD
    states = recorded(ledger)
    assert {states[customer_id(n)] for n in range(1, 3 * THRESHOLD + 1)} == {
        (DeliveryState.FAILED, "invalid_recipient")
    }
    assert {states[customer_id(n)] for n in range(3 * THRESHOLD + 1, 81)} == {
        (DeliveryState.SENT, None)
    }


def test_a_product_that_breaks_every_digest_still_stops_the_run(clock):
    addresses = {n: email_of(n) for n in range(1, 81)}
    ledger = week(addresses, bad_link_for=frozenset(addresses))

    with pytest.raises(BreakerOpen, match="render_error"):
        deliver(ledger, FakeMailer(clock=clock), clock)

    failed = [s for s in recorded(ledger).values() if s[0] is DeliveryState.FAILED]
    assert failed == [(DeliveryState.FAILED, "render_error")] * THRESHOLD


def test_bad_addresses_between_refused_sends_do_not_hide_a_revoked_key(clock):
    # every other customer's address is bad: the 401s still stop the run at the threshold
    ledger = week({n: typo(n) if n % 2 else email_of(n) for n in range(1, 101)})
    revoked = SendOutcome.failed(FailureClass.PERMANENT, "http:401:invalid_api_key")
    mailer = SystemicFailureMailer(FakeMailer(clock=clock), revoked)

    with pytest.raises(BreakerOpen, match="http:401"):
        deliver(ledger, mailer, clock)

    assert mailer.sends == THRESHOLD
