"""A shop's picks rule replaces the built-in one, and a rule that fails one customer costs that
customer their digest, never the week.

A failing customer gets no rows; delivery then fails their item permanently with `render_error`
(the composer refuses a digest without rows) while everyone else is sent. The reason is on a
`picks_rule_failed` line under the customer's operation key: the exception's class and where it
was raised, or what was wrong with the answer, never the customer's address or a product's text.
Delivery renders with the real Jinja2 composer.
"""

import logging
from datetime import UTC, datetime, timedelta

import pytest

from digest_pipeline.adapters.mail.render import Jinja2Composer
from digest_pipeline.domain.catalogue import (
    Order,
    PicksRule,
    Product,
    popular_in_your_categories,
)
from digest_pipeline.domain.failures import RENDER_ERROR, FailureClass
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.services.content import ContentReport, generate_content
from digest_pipeline.services.enqueue import enqueue_period
from digest_pipeline.services.replay import replay_keys
from digest_pipeline.services.snapshot import take_snapshot
from digest_pipeline_tests import picks_rules
from digest_pipeline_tests.builders import (
    deliver_all,
    email_of,
    key_of,
    make_customer,
    make_deliverer,
    rows_of,
    state_of,
)
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.fakes import FakeCustomerSource, FakeLedger, FakeMailer, FixedClock

pytestmark = pytest.mark.usefixtures("both_mailer_kinds")

CUSTOMERS = 4
UNLUCKY = key_of(2)
assert str(UNLUCKY.customer_id) == picks_rules.UNLUCKY
OLD = W42.starts_at - timedelta(days=300)


def product(n: int, price_cents: int) -> Product:
    return Product(
        f"product-{n:03d}",
        f"Walnut chopping board {n}",
        "Kitchen",
        price_cents,
        "EUR",
        f"https://shop.example/p/{n:03d}",
        None,
        OLD,
    )


#: the cheapest is the least popular, so the example rule and the built-in one disagree
PRODUCTS = [product(n, 1000 * (7 - n)) for n in range(1, 7)]
#: (order, customer, product): product 1 sells most, then 2; customer 1 bought product 1
ORDERS = [(1, 1, 1), (2, 1, 1), (3, 3, 1), (4, 3, 2), (5, 4, 2)]


def shop() -> FakeCustomerSource:
    orders = [
        Order(f"o-{o}", f"customer-{c:04d}", f"product-{p:03d}", datetime(2026, 10, 1, tzinfo=UTC))
        for o, c, p in ORDERS
    ]
    return FakeCustomerSource([make_customer(n) for n in range(1, CUSTOMERS + 1)], PRODUCTS, orders)


def keys() -> list[OperationKey]:
    return [key_of(n) for n in range(1, CUSTOMERS + 1)]


def composer(clock: FixedClock) -> Jinja2Composer:
    return Jinja2Composer(
        sender="digest@example.com",
        unsubscribe_url="https://shop.example/unsubscribe/{customer_id}?token={token}",
        unsubscribe_secret="s3cret",
        clock=clock,
    )


def week(clock: FixedClock, rule: PicksRule) -> tuple[FakeLedger, FakeMailer, ContentReport]:
    """Snapshot, content with `rule`, work items and one delivery pass of 2026-W42."""
    source, ledger, mailer = shop(), FakeLedger(), FakeMailer(clock=clock)
    take_snapshot(source, ledger, clock, W42, "run-1")
    report = generate_content(source, ledger, W42, picks_rule=rule)
    enqueue_period(ledger, clock, W42)
    deliver_all(make_deliverer(ledger, mailer, clock, composer=composer(clock)))
    return ledger, mailer, report


def picked(ledger: FakeLedger, key: OperationKey) -> list[object]:
    return [r.payload["product_id"] for r in rows_of(ledger, key)]


def test_the_shops_rule_replaces_the_built_in_one(clock):
    ledger, mailer, report = week(clock, picks_rules.cheapest_first)

    # the cheapest four, whatever sold: product 6 is the cheapest
    expected = ["product-006", "product-005", "product-004", "product-003"]
    assert {k: picked(ledger, k) for k in keys()} == dict.fromkeys(keys(), expected)
    assert (report.picks_rule_failed, report.without_picks) == (0, 0)
    assert {state_of(ledger, k) for k in keys()} == {DeliveryState.SENT}
    assert mailer.sends == CUSTOMERS


def test_the_built_in_rule_still_picks_by_popularity(clock):
    ledger, _, _ = week(clock, popular_in_your_categories)

    # best sellers first (1, then 2), unsold ones after in id order; customer 1 bought 1
    assert picked(ledger, key_of(1)) == [f"product-00{n}" for n in (2, 3, 4, 5)]
    assert picked(ledger, key_of(2)) == [f"product-00{n}" for n in (1, 2, 3, 4)]


@pytest.mark.parametrize(
    ("rule", "why"),
    [
        (picks_rules.raises_for_one, "raised LookupError at picks_rules.py:"),
        (
            picks_rules.junk_for_one,
            "pick 1 (product-404) is not in the week's screened catalogue",
        ),
        (picks_rules.too_many_for_one, "returned 6 picks; at most 4"),
        (picks_rules.a_set_for_one, "returned a set, not a list or tuple"),
    ],
    ids=["raises", "unknown-id", "too-many", "not-a-sequence"],
)
def test_a_rule_that_fails_one_customer_fails_only_that_customer(clock, caplog, rule, why):
    caplog.set_level(logging.INFO, logger="digest_pipeline")

    ledger, mailer, report = week(clock, rule)

    others = [k for k in keys() if k != UNLUCKY]
    assert {state_of(ledger, k) for k in others} == {DeliveryState.SENT}
    assert mailer.sends == CUSTOMERS - 1
    assert mailer.sends_for(UNLUCKY) == 0
    item = ledger.get(UNLUCKY)
    assert item is not None
    assert item.state is DeliveryState.FAILED
    assert item.last_failure_class is FailureClass.PERMANENT
    assert (item.last_detail or "").startswith(RENDER_ERROR)
    assert rows_of(ledger, UNLUCKY) == []
    assert (report.picks_rule_failed, report.picks_rule_failed_sample) == (1, (UNLUCKY,))
    assert report.without_picks == 0
    # the reason, by operation key, and nothing of the customer or the catalogue's text
    lines = [r.getMessage() for r in caplog.records if "picks_rule_failed" in r.getMessage()]
    item_line = next(line for line in lines if f"key={UNLUCKY} " in line)
    assert item_line.startswith(f"event=picks_rule_failed key={UNLUCKY} why=")
    assert why in item_line
    step_line = next(line for line in lines if line.startswith("event=content_picks_rule"))
    assert f"customers=1 rule=digest_pipeline_tests.picks_rules:{rule.__name__}" in step_line
    for line in lines:
        assert email_of(2) not in line
        assert "Walnut" not in line  # the raising rule's message quotes a product title
        assert "no profile" not in line


def test_a_customer_the_rule_failed_is_asked_for_again_by_the_next_run(clock):
    source, ledger = shop(), FakeLedger()
    take_snapshot(source, ledger, clock, W42, "run-1")

    first = generate_content(source, ledger, W42, picks_rule=picks_rules.raises_for_one)
    second = generate_content(source, ledger, W42, picks_rule=picks_rules.cheapest_first)

    assert (first.customers, first.picks_rule_failed) == (CUSTOMERS, 1)
    # only the failed customer needed rows; the rule, now fixed, gave them theirs
    assert (second.customers, second.skipped_existing, second.picks_rule_failed) == (1, 3, 0)
    assert picked(ledger, UNLUCKY) == ["product-006", "product-005", "product-004", "product-003"]


def test_a_rule_failing_everyone_still_finishes_the_week(clock):
    def broken(request: object) -> list[str]:
        raise RuntimeError("catalogue service down")

    ledger, mailer, report = week(clock, broken)

    assert (report.customers, report.rows, report.picks_rule_failed) == (CUSTOMERS, 0, CUSTOMERS)
    assert len(report.picks_rule_failed_sample) == CUSTOMERS
    assert {state_of(ledger, k) for k in keys()} == {DeliveryState.FAILED}
    assert mailer.sends == 0


def test_fix_the_rule_then_generate_then_replay_delivers_the_failed_customer(clock):
    ledger, mailer, _ = week(clock, picks_rules.raises_for_one)
    assert state_of(ledger, UNLUCKY) is DeliveryState.FAILED

    again = generate_content(shop(), ledger, W42, picks_rule=picks_rules.cheapest_first)
    clock.advance(timedelta(minutes=5))
    replay_keys(
        ledger, mailer, clock, W42, [UNLUCKY], operator="ada", reason="rule fixed", dry_run=False
    )
    deliver_all(make_deliverer(ledger, mailer, clock, composer=composer(clock)))

    assert (again.customers, again.rows) == (1, 4)  # only the customer without rows
    assert {k: state_of(ledger, k) for k in keys()} == dict.fromkeys(keys(), DeliveryState.SENT)
    assert mailer.sends == CUSTOMERS
