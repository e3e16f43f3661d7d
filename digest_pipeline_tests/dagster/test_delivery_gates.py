"""The snapshot gate and the circuit breaker in Dagster: what the `digest_retry_sweeper` sensor runs
(`digest_deliveries`, `digest_cleanup`, without the snapshot's asset check) fails visibly at its
delivery step for a week whose frozen snapshot changed, or whose provider refuses every send,
sending nothing to the changed address and cleaning nothing."""

import dagster as dg

from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline_tests.builders import key_of
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.dagster.harness import BEFORE_DELIVERY, DELIVERY_AND_CLEANUP, refusal
from digest_pipeline_tests.fakes import SystemicFailureMailer

TAMPERED = "tampered@example.com"


def step_failures(result: dg.ExecuteInProcessResult) -> dict[str, str]:
    return {
        e.step_key or "": e.step_failure_data.error.message  # type: ignore[union-attr]
        for e in result.all_events
        if e.is_step_failure
    }


def test_the_sweepers_run_of_a_tampered_week_is_refused_and_sends_and_cleans_nothing(world_of):
    world = world_of(3)
    world.materialize(selection=BEFORE_DELIVERY)
    world.ledger.tamper_snapshot(W42, "customer-0002", TAMPERED)
    before = world.ledger.items(W42)

    result = world.materialize(selection=DELIVERY_AND_CLEANUP, raise_on_error=False)

    assert "period 2026-W42: its frozen eligibility snapshot" in refusal(world, result)
    [observation] = result.get_asset_observation_events()
    assert observation.asset_key == dg.AssetKey("digest_deliveries")
    assert world.mailer.sends == 0
    assert world.ledger.items(W42) == before
    assert world.ledger.cleanups == []
    assert result.asset_materializations_for_node("digest_cleanup") == []


def test_a_tamper_after_the_plan_fails_the_delivery_batch_before_it_claims(world_of):
    world = world_of(3)
    world.materialize(selection=BEFORE_DELIVERY)
    ledger = world.ledger
    original = ledger.check_invariants

    def plan_sees_it_intact_then_tamper(period, now, names=None):
        results = original(period, now, names)
        ledger.check_invariants = original
        ledger.tamper_snapshot(W42, "customer-0002", TAMPERED)
        return results

    ledger.check_invariants = plan_sees_it_intact_then_tamper
    result = world.materialize(selection=DELIVERY_AND_CLEANUP, raise_on_error=False)

    assert not result.success
    [(step, message)] = step_failures(result).items()
    assert step.startswith("digest_deliveries.deliver_batch")
    assert "period 2026-W42" in message
    assert world.mailer.sends == 0
    assert {i.state for i in ledger.items(W42)} == {DeliveryState.PENDING}
    assert ledger.cleanups == []


def test_a_provider_refusing_every_send_fails_the_delivery_step_with_the_code(world_of):
    world = world_of(30)
    world.materialize(selection=BEFORE_DELIVERY)
    refusing = SystemicFailureMailer(
        world.mailer, SendOutcome.failed(FailureClass.PERMANENT, "http:401:invalid_api_key")
    )

    result = world.materialize(
        selection=DELIVERY_AND_CLEANUP,
        raise_on_error=False,
        mailer=refusing,
        breaker_threshold=5,
        concurrency=2,
    )

    assert not result.success
    [(step, message)] = step_failures(result).items()
    assert step.startswith("digest_deliveries.deliver_batch")
    assert "5 consecutive" in message
    assert "http:401:invalid_api_key" in message
    assert refusing.sends == 5
    counts = world.ledger.state_counts(W42)
    assert counts == {DeliveryState.RETRY_SCHEDULED: 5, DeliveryState.PENDING: 25}
    assert world.ledger.get(key_of(30)) is not None
    assert world.ledger.cleanups == []
