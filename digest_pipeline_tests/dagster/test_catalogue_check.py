"""A week with one malformed catalogue row, through the Dagster assets and checks.

The real Jinja2 composer renders here (the harness's fake composer accepts any link), so a bad
product that reached the picks would fail every digest it is in with `render_error`.
"""

from dataclasses import replace

import dagster as dg

from digest_pipeline.adapters.mail.render import Jinja2Composer
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline_tests.builders import make_customer
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.dagster.harness import (
    ASSETS,
    CHECKS,
    PARTITION,
    World,
    catalogue,
    checks,
    metadata,
    orders,
)
from digest_pipeline_tests.fakes import FakeCustomerSource

BAD_ID = "product-002"
BAD_IMAGE = 'https://cdn.shop.example/p/002.jpg" onerror="alert(1)'


def broken_world(world: World, *, bad: str = BAD_IMAGE) -> World:
    products = [replace(p, image_url=bad) if p.product_id == BAD_ID else p for p in catalogue()]
    world.source = FakeCustomerSource(
        [make_customer(n) for n in range(1, world.customers + 1)],
        products,
        orders(world.customers),
    )
    return world


def materialize(world: World) -> dg.ExecuteInProcessResult:
    resources = world.resources()
    resources["composer"] = Jinja2Composer(
        sender="digest@example.com",
        unsubscribe_url="https://shop.example/unsubscribe/{customer_id}?token={token}",
        unsubscribe_secret="s3cret",
        clock=world.clock,
    )
    return dg.materialize(
        [*ASSETS, *CHECKS], partition_key=PARTITION, resources=resources, instance=world.instance
    )


def test_a_week_with_one_bad_product_delivers_every_customer_and_warns_by_product_id(world_of):
    world = broken_world(world_of(5))

    result = materialize(world)

    assert result.success
    assert world.ledger.state_counts(W42) == {DeliveryState.CLEANED: 5}  # sent, then cleaned
    assert world.mailer.sends == 5
    content = metadata(result, "digest_content")
    assert content["excluded_products"] == 1
    assert content["excluded_product_ids"] == {BAD_ID: ["image_url"]}
    evaluation = checks(result)["catalogue_products_valid"]
    assert not evaluation.passed
    assert evaluation.severity is dg.AssetCheckSeverity.WARN
    assert evaluation.metadata["sample"].value == [BAD_ID]
    assert evaluation.metadata["excluded"].value == {BAD_ID: ["image_url"]}
    assert f"{BAD_ID} (image_url)" in (evaluation.description or "")
    assert "onerror" not in str(evaluation.metadata) + (evaluation.description or "")


def test_the_check_passes_once_the_product_is_fixed(world_of):
    world = broken_world(world_of(3))
    materialize(world)
    broken_world(world, bad="https://cdn.shop.example/p/002.jpg")

    result = materialize(world)

    evaluation = checks(result)["catalogue_products_valid"]
    assert evaluation.passed
    assert evaluation.metadata["violations"].value == 0
    assert "excluded_products" not in metadata(result, "digest_content")
