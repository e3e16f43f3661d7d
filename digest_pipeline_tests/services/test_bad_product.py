"""One malformed catalogue row must cost that product its place, not the week.

Delivery here renders with the real Jinja2 composer, the one that refuses an unsafe link, so a
bad product that reached the digest rows would show up as a permanent `render_error`.
"""

from dataclasses import replace
from datetime import timedelta

import pytest

from digest_pipeline.adapters.mail.render import Jinja2Composer
from digest_pipeline.domain import catalogue
from digest_pipeline.domain.catalogue import Product, ProductProblem
from digest_pipeline.domain.errors import RenderError
from digest_pipeline.domain.failures import FailureClass
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.domain.regeneration import RegenerateRefused
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.services.content import generate_content
from digest_pipeline.services.enqueue import enqueue_period
from digest_pipeline.services.regenerate import regenerate_period
from digest_pipeline.services.replay import replay_keys
from digest_pipeline.services.snapshot import take_snapshot
from digest_pipeline_tests.builders import (
    deliver_all,
    key_of,
    make_customer,
    make_deliverer,
    rows_of,
    state_of,
)
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.fakes import FakeCustomerSource, FakeLedger, FakeMailer, FixedClock

# every test here on both delivery loops: a provider's pool and a local mailer's ledger thread
pytestmark = pytest.mark.usefixtures("both_mailer_kinds")

CUSTOMERS = 4
BAD_ID = "product-002"
#: a quote closes the src attribute: the classic way a scraped image link breaks out of it
BAD_IMAGE = 'https://cdn.shop.example/p/002.jpg" onerror="alert(1)'
OLD = W42.starts_at - timedelta(days=300)


def product(n: int, **overrides: object) -> Product:
    good = Product(
        f"product-{n:03d}",
        f"Celadon Teapot No. {n}",
        "Kitchen",
        1250 + n,
        "EUR",
        f"https://shop.example/p/{n:03d}",
        f"https://cdn.shop.example/p/{n:03d}.jpg",
        OLD,
    )
    return replace(good, **overrides)  # type: ignore[arg-type]


def shop(*, broken: bool) -> FakeCustomerSource:
    products = [product(n) for n in range(1, 6)]
    if broken:
        products[1] = product(2, image_url=BAD_IMAGE)
    return FakeCustomerSource([make_customer(n) for n in range(1, CUSTOMERS + 1)], products, [])


def composer(clock: FixedClock) -> Jinja2Composer:
    return Jinja2Composer(
        sender="digest@example.com",
        unsubscribe_url="https://shop.example/unsubscribe/{customer_id}?token={token}",
        unsubscribe_secret="s3cret",
        clock=clock,
    )


def deliver(ledger: FakeLedger, mailer: FakeMailer, clock: FixedClock) -> None:
    deliver_all(make_deliverer(ledger, mailer, clock, composer=composer(clock)))


def frozen_week(source: FakeCustomerSource, clock: FixedClock) -> FakeLedger:
    ledger = FakeLedger()
    take_snapshot(source, ledger, clock, W42, "run-1")
    return ledger


def keys() -> list[OperationKey]:
    return [key_of(n) for n in range(1, CUSTOMERS + 1)]


def test_a_week_with_one_bad_product_delivers_every_customer(clock):
    source, mailer = shop(broken=True), FakeMailer(clock=clock)
    ledger = frozen_week(source, clock)

    report = generate_content(source, ledger, W42)
    enqueue_period(ledger, clock, W42)
    deliver(ledger, mailer, clock)

    assert report.excluded == (ProductProblem(BAD_ID, ("image_url",)),)
    assert report.without_picks == 0
    assert {k: state_of(ledger, k) for k in keys()} == dict.fromkeys(keys(), DeliveryState.SENT)
    assert mailer.sends == CUSTOMERS
    picked = {r.payload["product_id"] for k in keys() for r in rows_of(ledger, k)}
    assert BAD_ID not in picked
    assert len(picked) == 4


def frozen_with_the_bad_product(clock: FixedClock) -> tuple[FakeLedger, FakeMailer]:
    """A week whose rows were generated before the screening: every digest holds the bad pick."""
    source, mailer = shop(broken=True), FakeMailer(clock=clock)
    ledger = frozen_week(source, clock)
    products = list(source.products())
    ledger.add_digest_rows(r for k in keys() for r in catalogue.digest_rows_for(k, products))
    enqueue_period(ledger, clock, W42)
    deliver(ledger, mailer, clock)
    return ledger, mailer


def test_the_render_error_names_the_product_and_the_field(clock):
    ledger, _ = frozen_with_the_bad_product(clock)
    item = ledger.get(key_of(1))
    assert item is not None
    assert (item.state, item.last_failure_class) == (DeliveryState.FAILED, FailureClass.PERMANENT)

    with pytest.raises(RenderError) as refused:
        composer(clock).compose(item, "ada@example.com", rows_of(ledger, item.key))

    assert str(refused.value) == (
        f"{item.key}: digest row 1 (product {BAD_ID}) has an invalid image_url"
    )


def test_fix_the_product_then_regenerate_then_replay_delivers_the_failed_customers(clock):
    ledger, mailer = frozen_with_the_bad_product(clock)
    assert {state_of(ledger, k) for k in keys()} == {DeliveryState.FAILED}
    fixed = shop(broken=False)

    report = regenerate_period(
        fixed,
        ledger,
        clock,
        W42,
        operator="ada",
        reason="fixed image of product-002",
        dry_run=False,
    )

    assert (report.regenerated, report.unchanged, report.changed_meanwhile) == (CUSTOMERS, 0, 0)
    assert (report.to_replay, report.to_replay_sample) == (CUSTOMERS, tuple(keys()))
    assert report.considered == {DeliveryState.FAILED: CUSTOMERS}
    assert {state_of(ledger, k) for k in keys()} == {
        DeliveryState.FAILED
    }  # regenerate changes no state
    [audit] = [e for e in ledger.audit_log(W42) if e.action == "regenerate"]
    assert (audit.actor, audit.period, audit.key) == ("ada", W42, None)
    assert audit.reason.startswith("fixed image of product-002 (never-sent items: failed 4")

    clock.advance(timedelta(minutes=5))
    replay_keys(
        ledger, mailer, clock, W42, keys(), operator="ada", reason="catalogue fixed", dry_run=False
    )
    deliver(ledger, mailer, clock)

    assert {k: state_of(ledger, k) for k in keys()} == dict.fromkeys(keys(), DeliveryState.SENT)
    assert mailer.sends == CUSTOMERS
    html = mailer.sent_messages[0].html or ""
    assert "cdn.shop.example/p/002.jpg" in html
    assert "onerror" not in html


def test_a_dry_run_counts_and_changes_nothing(clock):
    ledger, _ = frozen_with_the_bad_product(clock)
    before = {k: rows_of(ledger, k) for k in keys()}

    report = regenerate_period(
        shop(broken=False), ledger, clock, W42, operator="ada", reason="check", dry_run=True
    )

    assert (report.dry_run, report.regenerated, report.to_replay) == (True, CUSTOMERS, CUSTOMERS)
    assert report.rows == 4 * CUSTOMERS  # four picks each, from the four good products
    assert {k: rows_of(ledger, k) for k in keys()} == before
    assert ledger.audit_log(W42) == []


def test_items_whose_rows_already_match_the_catalogue_are_left_alone(clock):
    ledger, _ = frozen_with_the_bad_product(clock)
    fixed = shop(broken=False)
    regenerate_period(fixed, ledger, clock, W42, operator="ada", reason="first", dry_run=False)

    again = regenerate_period(
        fixed, ledger, clock, W42, operator="ada", reason="again", dry_run=False
    )

    assert (again.regenerated, again.unchanged, again.rows) == (0, CUSTOMERS, 0)


def test_sent_items_are_never_considered(clock):
    source, mailer = shop(broken=True), FakeMailer(clock=clock)
    ledger = frozen_week(source, clock)
    generate_content(source, ledger, W42)
    enqueue_period(ledger, clock, W42)
    deliver(ledger, mailer, clock)
    before = {k: rows_of(ledger, k) for k in keys()}

    report = regenerate_period(
        shop(broken=False), ledger, clock, W42, operator="ada", reason="x", dry_run=False
    )

    assert (report.considered, report.regenerated) == ({}, 0)
    assert {k: rows_of(ledger, k) for k in keys()} == before
    assert ledger.audit_log(W42) == []


@pytest.mark.parametrize(("operator", "reason"), [("", "why"), ("ada", "  ")])
def test_a_regeneration_needs_an_operator_and_a_reason(clock, operator, reason):
    ledger, _ = frozen_with_the_bad_product(clock)

    with pytest.raises(RegenerateRefused):
        regenerate_period(
            shop(broken=False), ledger, clock, W42, operator=operator, reason=reason, dry_run=False
        )
