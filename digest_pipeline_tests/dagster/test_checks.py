"""Each asset check against a week whose invariant was broken on purpose, and against a clean one.

The invariants are broken through the ledger port (or the fake's test-only hooks), the way a bug,
a crash or a hand edit would break them, never by feeding the check an in-memory value.
"""

from datetime import datetime, timedelta

import dagster as dg
import pytest

from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.feedback import EventType, ProviderEvent
from digest_pipeline.domain.model import AuditNote, Claim, Transition
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.ports import Mailer
from digest_pipeline.services.feedback import record_event
from digest_pipeline_tests.builders import complete_one, key_of, start_one
from digest_pipeline_tests.conftest import T0, W42
from digest_pipeline_tests.dagster.graph import deliveries_checks
from digest_pipeline_tests.dagster.harness import (
    ASSETS,
    BEFORE_DELIVERY,
    CHECKS,
    DELIVERY_AND_CLEANUP,
    World,
    checks,
    metadata,
)
from digest_pipeline_tests.fakes import FakeMailer, FixedClock
from digest_pipeline_tests.feedback_fakes import FakeFeedbackStore

LEASE = DeliveryPolicy().lease
CHECK_NAMES = sorted(spec.name for c in (*ASSETS, *CHECKS) for spec in c.check_specs)


def assert_failed(
    result: dg.ExecuteInProcessResult, name: str, *, sample: list[str], says: str
) -> None:
    evaluation = checks(result)[name]
    assert not evaluation.passed
    assert evaluation.partition == "2026-W42-1"
    assert evaluation.metadata["period"].value == "2026-W42"
    assert (evaluation.description or "").startswith("2026-W42: ")
    assert says in (evaluation.description or "")
    assert evaluation.metadata["violations"].value == len(sample)
    assert evaluation.metadata["sample"].value == sample


def assert_cleanup_was_blocked(result: dg.ExecuteInProcessResult, world: World) -> None:
    assert not result.success
    assert result.asset_materializations_for_node("digest_cleanup") == []
    assert world.ledger.cleanups == []


@pytest.mark.parametrize("name", CHECK_NAMES)
def test_each_check_passes_on_a_clean_week(clean_week, name):
    evaluation = checks(clean_week.result)[name]
    assert evaluation.passed, evaluation.description
    assert evaluation.partition == "2026-W42-1"
    assert evaluation.metadata["period"].value == "2026-W42"
    assert evaluation.metadata["violations"].value == 0


def test_snapshot_unchanged_fails_after_a_frozen_address_is_edited_and_blocks_the_week(world_of):
    world = world_of(3)
    world.materialize()
    world.ledger.tamper_snapshot(W42, "customer-0002", "someone.else@mailbox.example")

    result = world.materialize(raise_on_error=False)

    assert_failed(
        result, "snapshot_unchanged", sample=["2026-W42"], says="changed after the freeze"
    )
    assert result.asset_materializations_for_node("digest_content") == []
    # the warning beside it in the same step was still evaluated
    assert checks(result)["no_invalid_recipients"].passed


def claim(world: World, now: datetime = T0, owner: str = "w1", lease: timedelta = LEASE) -> Claim:
    [c] = world.ledger.claim_due(now, owner, lease, 1, W42)
    return c


def test_no_duplicate_send_fails_for_a_second_confirmed_send_and_blocks_cleanup(world_of):
    world = world_of(1)
    world.materialize(selection=BEFORE_DELIVERY)
    ledger, key = world.ledger, key_of(1)
    c = claim(world)
    ticket = start_one(ledger, c, T0)
    ledger.recover_expired_leases(T0 + LEASE)  # the send outlived its lease: unknown
    late = T0 + LEASE + timedelta(seconds=1)
    with pytest.raises(Exception, match="expected claimed"):  # ...and then arrived
        complete_one(
            ledger,
            ticket,
            SendOutcome.sent("pm-1"),
            Transition(key, DeliveryState.CLAIMED, c.token, DeliveryState.SENT, late),
        )
    # an operator wrongly resolves "not sent" without reading the attempt history
    ledger.apply(
        Transition(
            key,
            DeliveryState.UNKNOWN,
            c.token,
            DeliveryState.RETRY_SCHEDULED,
            late,
            next_attempt_at=late,
            audit=AuditNote("alice", "resolve", "looked lost"),
        )
    )
    again = claim(world, now=late, owner="w2")
    ticket = start_one(ledger, again, late)
    complete_one(
        ledger,
        ticket,
        SendOutcome.sent("pm-2"),
        Transition(key, DeliveryState.CLAIMED, again.token, DeliveryState.SENT, late),
    )
    world.clock.set(late)

    result = world.materialize(selection=DELIVERY_AND_CLEANUP, raise_on_error=False)

    assert_failed(
        result,
        "no_duplicate_send",
        sample=[str(key)],
        says="may have been delivered more than once",
    )
    assert metadata(result, "digest_deliveries")["duplicate_sends"] == 1
    assert_cleanup_was_blocked(result, world)
    # one step evaluates every check of the asset: the red invariant hides none beside it
    assert set(checks(result)) == set(names_of(deliveries_checks()))


def names_of(step: dg.AssetsDefinition) -> set[str]:
    return {spec.name for spec in step.check_specs}


def test_a_check_selected_alone_is_the_only_one_its_step_evaluates(world_of):
    # Dagster 1.13 cannot plan a run of partitioned checks without an asset, so the week's
    # delivery (nothing left due) runs with one of its seven checks selected
    world = world_of(2)
    world.materialize()
    alone = dg.AssetCheckKey(dg.AssetKey("digest_deliveries"), "stale_items")
    selection = dg.AssetSelection.assets("digest_deliveries").without_checks()

    result = world.materialize(selection=selection | dg.AssetSelection.checks(alone))

    assert set(checks(result)) == {"stale_items"}


@pytest.mark.parametrize(
    ("asset", "name"),
    [
        ("eligibility_snapshot", "no_invalid_recipients"),
        ("digest_content", "catalogue_products_valid"),
        ("digest_cleanup", "at_most_one_cleanup_per_key"),
    ],
)
def test_a_check_of_an_asset_evaluated_in_its_step_runs_alone_without_the_asset(
    world_of, asset, name
):
    # the week delivered but not cleaned: running cleanup's step for its check must clean nothing
    world = world_of(2)
    world.materialize(selection=[*BEFORE_DELIVERY, "digest_deliveries"])
    alone = dg.AssetCheckKey(dg.AssetKey(asset), name)
    selection = dg.AssetSelection.assets("digest_deliveries").without_checks()

    result = world.materialize(selection=selection | dg.AssetSelection.checks(alone))

    assert set(checks(result)) == {name}
    assert result.asset_materializations_for_node(asset) == []
    assert {i.state for i in world.ledger.items(W42)} == {DeliveryState.SENT}


def test_an_asset_materialised_without_its_checks_evaluates_none(world_of):
    world = world_of(2)

    result = world.materialize(selection=dg.AssetSelection.all().without_checks())

    assert checks(result) == {}
    assert {i.state for i in world.ledger.items(W42)} == {DeliveryState.CLEANED}


def test_no_silent_timeout_fails_when_an_unknown_send_was_requeued_without_evidence(world_of):
    world = world_of(3)
    world.materialize(selection=BEFORE_DELIVERY)
    ledger, key = world.ledger, key_of(1)
    c = claim(world)
    ticket = start_one(ledger, c, T0)
    outcome = SendOutcome.failed(FailureClass.UNKNOWN, "timeout_after_send")
    complete_one(
        ledger,
        ticket,
        outcome,
        Transition(
            key,
            DeliveryState.CLAIMED,
            c.token,
            DeliveryState.UNKNOWN,
            T0,
            failure_class=FailureClass.UNKNOWN,
        ),
    )
    # a buggy job turns the timeout into "not sent": no reconciliation, no audit row
    ledger.apply(
        Transition(
            key,
            DeliveryState.UNKNOWN,
            c.token,
            DeliveryState.RETRY_SCHEDULED,
            T0,
            next_attempt_at=T0,
        )
    )

    result = world.materialize(selection=DELIVERY_AND_CLEANUP, raise_on_error=False)

    assert_failed(result, "no_silent_timeout", sample=[str(key)], says="without reconciliation")
    assert_cleanup_was_blocked(result, world)


class SlowProvider(Mailer):
    """A provider that takes `delay` of the test's time for every send."""

    def __init__(self, inner: FakeMailer, clock: FixedClock, delay: timedelta) -> None:
        self._inner, self._clock, self._delay = inner, clock, delay

    @property
    def capabilities(self):
        return self._inner.capabilities

    def send(self, message, *, idempotency_key):
        self._clock.advance(self._delay)
        return self._inner.send(message, idempotency_key=idempotency_key)


def test_every_customer_has_visible_state_fails_for_a_claim_that_outlived_its_lease(world_of):
    world = world_of(5)
    world.materialize(selection=BEFORE_DELIVERY)
    # a worker claimed customer 1 for 30 minutes, then died; the run's plan step finds the
    # lease still live, and by the time the checks run (4 sends of 10 minutes) it has expired
    stuck = claim(world, owner="crashed-worker", lease=timedelta(minutes=30))
    slow = SlowProvider(world.mailer, world.clock, timedelta(minutes=10))

    result = world.materialize(
        selection=DELIVERY_AND_CLEANUP, raise_on_error=False, mailer=slow, lease_seconds=3600
    )

    assert metadata(result, "digest_deliveries")["sent"] == 4
    assert_failed(
        result, "every_customer_has_visible_state", sample=[str(stuck.key)], says="stuck in a claim"
    )
    assert_cleanup_was_blocked(result, world)


@pytest.mark.parametrize("broken", ["cleaned_twice", "cleaned_without_a_send"])
def test_at_most_one_cleanup_per_key_fails_for_an_extra_cleanup_record(world_of, broken):
    world = world_of(3)
    world.mailer.script(key_of(2), SendOutcome.failed(FailureClass.PERMANENT, "smtp:550"))
    world.materialize()
    if broken == "cleaned_twice":
        world.ledger.force_duplicate_cleanup_record(key_of(1))
        key = key_of(1)
    else:
        world.ledger.force_cleanup_record(key_of(2), T0)
        key = key_of(2)

    result = world.materialize(selection=["digest_cleanup"])

    assert_failed(result, "at_most_one_cleanup_per_key", sample=[str(key)], says="cleaned twice")
    assert checks(result)["at_most_one_cleanup_per_key"].severity.value == "ERROR"


def test_stale_items_warns_when_the_oldest_waiting_item_passes_the_threshold(world_of):
    world = world_of(3)
    world.materialize(selection=BEFORE_DELIVERY)
    world.clock.advance(timedelta(minutes=2))
    throttled = SendOutcome.failed(
        FailureClass.THROTTLED, "http:429", retry_after=timedelta(hours=1)
    )
    world.mailer.script(key_of(3), throttled)

    result = world.materialize(selection=DELIVERY_AND_CLEANUP, stale_after_seconds=60)

    assert result.success  # a warning blocks nothing
    assert_failed(result, "stale_items", sample=[str(key_of(3))], says="waiting longer than")
    evaluation = checks(result)["stale_items"]
    assert evaluation.severity.value == "WARN"
    assert evaluation.metadata["oldest_pending_age_s"].value == 120.0


@pytest.mark.parametrize(("threshold", "passed"), [(0.05, False), (0.25, True)])
def test_dead_letter_volume_warns_above_its_threshold(world_of, threshold, passed):
    world = world_of(5)
    world.mailer.script(key_of(2), SendOutcome.failed(FailureClass.PERMANENT, "smtp:550"))

    result = world.materialize(dead_letter_rate_threshold=threshold)

    assert result.success
    evaluation = checks(result)["dead_letter_volume"]
    assert (evaluation.passed, evaluation.severity.value) == (passed, "WARN")
    assert evaluation.metadata["dead_letter_rate"].value == 0.2
    assert evaluation.metadata["eligible"].value == 5
    # violations and their sample count only above the threshold; the week's count is beside
    assert evaluation.metadata["dead_lettered_or_failed"].value == 1
    assert evaluation.metadata["violations"].value == (0 if passed else 1)
    assert evaluation.metadata["sample"].value == ([] if passed else [str(key_of(2))])
    verdict = "within the 25.0 % threshold" if passed else "above the 5.0 % threshold"
    assert evaluation.metadata["dead_letter_rate_pct"].value == f"20.0 % of 5 eligible, {verdict}"
    assert f"20.0 % of 5 eligible ({verdict})" in (evaluation.description or "")


@pytest.mark.parametrize(("complaints", "passed"), [(1, True), (2, False)])
def test_complaint_rate_warns_above_three_in_a_thousand_delivered(world_of, complaints, passed):
    world = world_of(400)
    assert world.materialize().success
    store = FakeFeedbackStore(world.ledger)
    for n in range(1, complaints + 1):
        event = ProviderEvent("resend", f"e-{n}", EventType.COMPLAINT, None, key_of(n))
        record_event(store, world.ledger, world.ledger, world.clock, event)

    # the week's checks run again (a re-run sends nothing twice) and read the events
    result = world.materialize()

    assert result.success
    evaluation = checks(result)["complaint_rate"]
    assert (evaluation.passed, evaluation.severity.value) == (passed, "WARN")
    assert evaluation.metadata["complaints"].value == complaints
    assert evaluation.metadata["delivered"].value == 400
    assert evaluation.metadata["complaint_rate"].value == round(complaints / 400, 4)
    verdict = "within the 0.3 % limit" if passed else "above the 0.3 % limit"
    assert verdict in (evaluation.description or "")
    deliveries = metadata(result, "digest_deliveries")
    assert (deliveries["complaints"], deliveries["suppressed"]) == (complaints, 0)
