"""A run launched from the UI or by the sensor fails closed on the public demo secret, as `digest run` does.

The delivery step asks the composer which secret signs its links and the ledger whether it holds
`digest seed` demo data: the public value on a real shop's ledger fails the step with one line,
before anything is claimed; on the demo's ledger, or with a private secret, the week goes out.
"""

from pathlib import Path

import pytest

from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.settings import load_settings
from digest_pipeline.wiring import build_composer
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.dagster.harness import World


def _with_composer(world: World, secret: str | None) -> World:
    env = {} if secret is None else {"DIGEST_UNSUBSCRIBE_SECRET": secret}
    world.composer = build_composer(load_settings(env, Path.cwd()), world.clock)  # type: ignore[assignment]
    return world


def test_the_public_secret_on_a_real_shops_ledger_fails_delivery_and_sends_nothing(world_of):
    world = _with_composer(world_of(3), None)
    world.ledger.demo_data = False

    result = world.materialize(raise_on_error=False)

    assert not result.success
    failures = [e for e in result.all_events if e.is_step_failure]
    assert failures
    assert all("public demo value" in str(e.event_specific_data) for e in failures)
    assert world.mailer.deliveries == []
    assert {i.state for i in world.ledger.items(W42)} == {DeliveryState.PENDING}


@pytest.mark.parametrize(("secret", "demo"), [(None, True), ("a-private-secret-0123", False)])
def test_the_demo_ledger_or_a_private_secret_delivers(world_of, secret, demo):
    world = _with_composer(world_of(3), secret)
    world.ledger.demo_data = demo

    result = world.materialize()

    assert result.success
    assert {i.state for i in world.ledger.items(W42)} == {DeliveryState.CLEANED}
