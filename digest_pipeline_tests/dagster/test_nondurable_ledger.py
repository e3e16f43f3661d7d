"""A run from the UI, the schedule or the sensor is refused on a ledger that can lose commits.

The suite's PostgreSQL runs with `fsync` and `synchronous_commit` off. Without
`DIGEST_ALLOW_NONDURABLE_LEDGER` the week's first step refuses it with the line naming them (the
run's `digest/refused` tag) and the ledger stays empty; a sensor's run, which starts at
delivery, is refused there with every item still pending. With the allowance the week goes out.
A fake ledger has no database to ask.
"""

from collections.abc import Callable

import pytest
from sqlalchemy import Engine

from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.domain.durability import ALLOW_VARIABLE
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.dagster.harness import (
    BEFORE_DELIVERY,
    DELIVERY_AND_CLEANUP,
    World,
    refusal,
)

pytestmark = pytest.mark.integration

LINE = "delivery refused: the ledger's PostgreSQL runs with fsync=off and synchronous_commit=off"


@pytest.fixture
def on_postgres(
    world_of: Callable[..., World], sql_engine_factory: Callable[[str], Engine]
) -> World:
    world = world_of(3)
    world.ledger = SqlLedger(sql_engine_factory("postgres"))  # type: ignore[assignment]
    return world


def test_without_the_allowance_the_week_is_refused_at_its_first_step_and_records_nothing(
    on_postgres, monkeypatch
):
    monkeypatch.delenv(ALLOW_VARIABLE, raising=False)

    result = on_postgres.materialize(raise_on_error=False)

    assert LINE in refusal(on_postgres, result)
    assert on_postgres.ledger.snapshot(W42) is None
    assert on_postgres.ledger.items(W42) == []
    assert on_postgres.mailer.deliveries == []


def test_a_sensors_run_is_refused_at_delivery_and_leaves_every_item_pending(
    on_postgres, monkeypatch
):
    monkeypatch.setenv(ALLOW_VARIABLE, "1")
    assert on_postgres.materialize(selection=BEFORE_DELIVERY).success
    monkeypatch.delenv(ALLOW_VARIABLE)

    result = on_postgres.materialize(selection=DELIVERY_AND_CLEANUP, raise_on_error=False)

    assert LINE in refusal(on_postgres, result)
    assert {i.state for i in on_postgres.ledger.items(W42)} == {DeliveryState.PENDING}
    assert on_postgres.mailer.deliveries == []


def test_with_the_allowance_the_week_goes_out(on_postgres, monkeypatch):
    monkeypatch.setenv(ALLOW_VARIABLE, "1")

    result = on_postgres.materialize()

    assert result.success
    assert {i.state for i in on_postgres.ledger.items(W42)} == {DeliveryState.CLEANED}
