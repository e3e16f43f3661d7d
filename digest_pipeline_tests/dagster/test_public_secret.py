"""A run launched from the UI or by the sensor is refused on a wrong secret, as `digest run` is.

The week's first step asks the composer which secret signs its links and the ledger whether it
holds `digest seed` demo data: the public value or a short one on a real shop's ledger refuses
the week with one line before anything is recorded, and so does a secret whose fingerprint is
not the one the ledger recorded, an unsubscribe link that is not public https, or no postal
address; a delivery step asks again. On the demo's ledger, or with the recorded private secret,
the week goes out.
"""

from pathlib import Path

import pytest

from digest_pipeline.domain.fingerprints import UNSUBSCRIBE, fingerprint
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.settings import load_settings
from digest_pipeline.wiring import build_composer
from digest_pipeline_tests.builders import SHOP_LINK_SETTINGS, SHOP_UNSUBSCRIBE_URL
from digest_pipeline_tests.conftest import T0, W42
from digest_pipeline_tests.dagster.harness import (
    BEFORE_DELIVERY,
    DELIVERY_AND_CLEANUP,
    World,
    refusal,
)


def _with_composer(
    world: World, secret: str | None, links: dict[str, str] = SHOP_LINK_SETTINGS
) -> World:
    env = {**links} if secret is None else {**links, "DIGEST_UNSUBSCRIBE_SECRET": secret}
    world.composer = build_composer(load_settings(env, Path.cwd()), world.clock)  # type: ignore[assignment]
    return world


def test_the_public_secret_on_a_real_shops_ledger_refuses_the_week_and_records_nothing(world_of):
    world = _with_composer(world_of(3), None)
    world.ledger.demo_data = False

    result = world.materialize(raise_on_error=False)

    assert "public demo value" in refusal(world, result)
    assert world.mailer.deliveries == []
    assert world.ledger.snapshot(W42) is None


def test_a_delivery_step_refuses_the_public_secret_after_the_week_began(world_of):
    world = world_of(3)
    world.ledger.demo_data = False
    world.materialize(selection=BEFORE_DELIVERY)
    _with_composer(world, None)

    result = world.materialize(selection=DELIVERY_AND_CLEANUP, raise_on_error=False)

    assert "public demo value" in refusal(world, result)
    assert world.mailer.deliveries == []
    assert {i.state for i in world.ledger.items(W42)} == {DeliveryState.PENDING}


@pytest.mark.parametrize(("secret", "demo"), [(None, True), ("a-private-secret-0123", False)])
def test_the_demo_ledger_or_a_private_secret_delivers(world_of, secret, demo):
    world = _with_composer(world_of(3), secret)
    world.ledger.demo_data = demo

    result = world.materialize()

    assert result.success
    assert {i.state for i in world.ledger.items(W42)} == {DeliveryState.CLEANED}


def test_a_secret_other_than_the_recorded_one_refuses_the_week_and_sends_nothing(world_of):
    world = _with_composer(world_of(3), "a-private-secret-0123")
    world.ledger.demo_data = False
    recorded = fingerprint("the-secret-the-links-were-signed-with")
    world.ledger.secret_fingerprints.record_first_fingerprint(UNSUBSCRIBE, recorded, T0)

    result = world.materialize(raise_on_error=False)

    assert "DIGEST_UNSUBSCRIBE_SECRET is not the secret this ledger" in refusal(world, result)
    assert world.mailer.deliveries == []
    assert world.ledger.snapshot(W42) is None
    record = world.ledger.secret_fingerprints.fingerprint_record(UNSUBSCRIBE)
    assert record is not None
    assert record.current == recorded


def test_a_short_secret_on_a_real_shops_ledger_refuses_the_week(world_of):
    world = _with_composer(world_of(3), "s3cret")
    world.ledger.demo_data = False

    result = world.materialize(raise_on_error=False)

    assert "DIGEST_UNSUBSCRIBE_SECRET" in refusal(world, result)
    assert world.mailer.deliveries == []
    assert world.ledger.secret_fingerprints.fingerprint_record(UNSUBSCRIBE) is None


def test_the_first_delivery_records_its_secrets_fingerprint(world_of):
    world = _with_composer(world_of(3), "a-private-secret-0123")
    world.ledger.demo_data = False

    assert world.materialize().success

    record = world.ledger.secret_fingerprints.fingerprint_record(UNSUBSCRIBE)
    assert record is not None
    assert record.current == fingerprint("a-private-secret-0123")


@pytest.mark.parametrize(
    ("links", "variable"),
    [
        ({"DIGEST_POSTAL_ADDRESS": "1 Market Street, Springfield"}, "DIGEST_UNSUBSCRIBE_URL"),
        ({"DIGEST_UNSUBSCRIBE_URL": SHOP_UNSUBSCRIBE_URL}, "DIGEST_POSTAL_ADDRESS"),
    ],
    ids=["loopback-link", "no-address"],
)
def test_a_loopback_link_or_no_address_on_a_real_shops_ledger_refuses_the_week(
    world_of, links, variable
):
    world = _with_composer(world_of(3), "a-private-secret-0123", links)
    world.ledger.demo_data = False

    result = world.materialize(raise_on_error=False)

    assert f"delivery refused: {variable} " in refusal(world, result)
    assert world.mailer.deliveries == []
    assert world.ledger.snapshot(W42) is None
    assert world.ledger.secret_fingerprints.fingerprint_record(UNSUBSCRIBE) is None


def test_the_demo_ledger_delivers_with_the_loopback_link_and_no_address(world_of):
    world = _with_composer(world_of(3), None, {})

    assert world.materialize().success
