"""A week materialised in process with fakes bound as resources: counts, re-runs and fan-out."""

from collections.abc import Callable
from datetime import timedelta

import dagster as dg
import pytest

from digest_pipeline.component.report import NONE_LEFT
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline_tests.builders import key_of, make_customer
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.dagster.conftest import PERMANENT, TRANSIENT
from digest_pipeline_tests.dagster.graph import project
from digest_pipeline_tests.dagster.harness import (
    ASSETS,
    BEFORE_DELIVERY,
    CHECK_COUNT,
    DELIVERY_AND_CLEANUP,
    PARTITION,
    World,
    checks,
    metadata,
)

#: what the cleanup step itself did: on digest_cleanup only
CLEANUP_ONLY = ("this_run_cleaned", "this_run_rows_cleaned", "this_run_held_back")


def mapped_steps(result) -> list[str]:
    return sorted(
        e.step_key
        for e in result.all_events
        if e.is_step_success and e.step_key.startswith("digest_deliveries.deliver_batch[")
    )


def test_a_week_materialises_and_records_its_counts(clean_week):
    world, result = clean_week.world, clean_week.result

    assert result.success
    snapshot = metadata(result, "eligibility_snapshot")
    assert (snapshot["eligible"], snapshot["this_run_considered"]) == (5, 5)
    assert snapshot["this_run_froze"] is True
    assert snapshot["selection_run_id"] == result.run_id
    assert metadata(result, "digest_content") == {
        "period": "2026-W42",
        "content_customers": 5,
        "content_missing": 0,
        "this_run_customers": 5,
        "this_run_rows": 20,
        "this_run_skipped_existing": 0,
        "this_run_without_picks": 0,
        "this_run_picks_rule_failed": 0,
    }
    assert metadata(result, "digest_work_items") == {
        "period": "2026-W42",
        "work_items": 5,
        "this_run_created": 5,
        "this_run_existing": 0,
    }
    deliveries = metadata(result, "digest_deliveries")
    assert {
        k: deliveries[k]
        for k in ("eligible", "sent", "work_items", "this_run_claimed", "this_run_batches")
    } == {"eligible": 5, "sent": 5, "work_items": 5, "this_run_claimed": 5, "this_run_batches": 1}
    assert deliveries["this_run_found_already_delivered"] == 0
    cleanup = metadata(result, "digest_cleanup")
    assert (cleanup["cleaned"], cleanup["sent"], cleanup["delivered"]) == (5, 0, 5)
    assert (cleanup["this_run_cleaned"], cleanup["this_run_rows_cleaned"]) == (5, 20)
    assert cleanup["this_run_held_back"] == 0
    assert len(world.mailer.deliveries) == 5
    assert all(e.passed for e in checks(result).values())
    assert len(checks(result)) == CHECK_COUNT
    # the graph asset orders itself after digest_work_items without loading a value from it
    assert not [
        e
        for e in result.all_events
        if e.step_key == "digest_deliveries.plan_batches" and e.event_type_value == "LOADED_INPUT"
    ]


def test_rematerialising_sends_nothing_twice_and_says_what_it_skipped(world_of):
    world = world_of(5)
    world.materialize()
    again = world.materialize()

    snapshot = metadata(again, "eligibility_snapshot")
    assert (snapshot["eligible"], snapshot["this_run_froze"]) == (5, False)
    assert "reused the snapshot frozen by run" in snapshot["note"]
    # each asset still describes the week; what the re-run did is under this_run_*
    content = metadata(again, "digest_content")
    assert (content["content_customers"], content["this_run_skipped_existing"]) == (5, 5)
    assert (content["this_run_customers"], content["this_run_rows"]) == (0, 0)
    assert metadata(again, "digest_work_items") == {
        "period": "2026-W42",
        "work_items": 5,
        "this_run_created": 0,
        "this_run_existing": 5,
    }
    deliveries = metadata(again, "digest_deliveries")
    states = {s.value: deliveries[s.value] for s in DeliveryState}
    assert states == {**dict.fromkeys(states, 0), "cleaned": 5}
    assert (deliveries["eligible"], deliveries["delivered"]) == (5, 5)
    assert deliveries["this_run_found_already_delivered"] == 5
    assert (deliveries["this_run_claimed"], deliveries["this_run_batches"]) == (0, 0)
    assert mapped_steps(again) == []
    cleanup = metadata(again, "digest_cleanup")
    assert (cleanup["cleaned"], cleanup["this_run_cleaned"]) == (5, 0)
    assert cleanup["this_run_found_cleaned"] == 5
    assert world.mailer.sends == 5
    assert world.mailer.duplicate_deliveries == 0


def test_batch_size_one_gives_one_mapped_step_per_customer(world_of):
    world = world_of(4)
    result = world.materialize(batch_size=1)

    assert mapped_steps(result) == [
        f"digest_deliveries.deliver_batch[batch_{i:04d}]" for i in range(4)
    ]
    assert metadata(result, "digest_deliveries")["this_run_batches"] == 4
    assert len(world.mailer.deliveries) == 4


def test_batches_cover_every_due_item_when_the_last_batch_is_partial(world_of):
    world = world_of(5)
    result = world.materialize(batch_size=2, concurrency=2)

    assert len(mapped_steps(result)) == 3
    assert metadata(result, "digest_deliveries")["sent"] == 5


def test_a_week_with_nobody_eligible_runs_no_mapped_step_and_still_records_metadata(world_of):
    world = world_of(0)
    world.source.update(make_customer(1, opted_in=False))
    result = world.materialize()

    assert result.success
    assert mapped_steps(result) == []
    deliveries = metadata(result, "digest_deliveries")
    assert (deliveries["eligible"], deliveries["sent"], deliveries["this_run_batches"]) == (0, 0, 0)
    assert metadata(result, "digest_cleanup")["cleaned"] == 0


def test_a_failed_send_is_a_recorded_state_and_cleanup_keeps_its_rows(week_with_failures):
    result = week_with_failures.result

    assert result.success
    deliveries = metadata(result, "digest_deliveries")
    assert (deliveries["sent"], deliveries["failed"], deliveries["retry_scheduled"]) == (3, 1, 1)
    assert deliveries["permanent_attempts_fraction"] == 0.2
    assert deliveries["transient_attempts_fraction"] == 0.2
    worst = deliveries["worst_items"].records
    assert [(r.data["key"], r.data["state"]) for r in worst] == [
        (str(key_of(2)), "failed"),
        (str(key_of(4)), "retry_scheduled"),
    ]
    assert worst[0].data["last_failure"] == "permanent: smtp:550"
    cleanup = metadata(result, "digest_cleanup")
    assert (cleanup["cleaned"], cleanup["this_run_held_back_failed"]) == (3, 1)
    assert cleanup["this_run_held_back_retry_scheduled"] == 1


def test_worst_items_lists_only_items_not_sent_worst_first(world_of):
    world = world_of(25)
    world.mailer.script(key_of(5), TRANSIENT)
    for n in (17, 3):
        world.mailer.script(key_of(n), PERMANENT)
    result = world.materialize()

    records = metadata(result, "digest_deliveries")["worst_items"].records
    assert [(r.data["key"], r.data["state"]) for r in records] == [
        (str(key_of(3)), "failed"),
        (str(key_of(17)), "failed"),
        (str(key_of(5)), "retry_scheduled"),
    ]
    # the key names the customer; no address, no content
    assert set(records[0].data) == {"key", "state", "attempts", "last_failure"}


def test_worst_items_holds_at_most_twenty_rows(world_of):
    world = world_of(25)
    for n in range(1, 23):
        world.mailer.script(key_of(n), PERMANENT)
    # 22 identical failures in a row would open the circuit breaker (20): this is about the table
    result = world.materialize(breaker_threshold=0)

    records = metadata(result, "digest_deliveries")["worst_items"].records
    assert [r.data["key"] for r in records] == [str(key_of(n)) for n in range(1, 21)]


def test_worst_items_says_none_when_every_item_went_out(world_of):
    world = world_of(3)
    result = world.materialize()

    assert metadata(result, "digest_deliveries")["worst_items"] == NONE_LEFT
    # a re-run, with every item now cleaned: still nothing to list
    again = world.materialize(selection=DELIVERY_AND_CLEANUP)
    assert metadata(again, "digest_deliveries")["worst_items"] == NONE_LEFT


def materialised_week_with_failures(
    world_of: Callable[..., World],
) -> tuple[World, dg.ExecuteInProcessResult]:
    """`week_with_failures` in a world of the test's own, for a test that runs it on."""
    world = world_of(5)
    world.mailer.script(key_of(2), PERMANENT)
    world.mailer.script(key_of(4), TRANSIENT)
    return world, world.materialize()


def test_every_materialisation_and_check_evaluation_names_the_iso_week(week_with_failures):
    result = week_with_failures.result

    materialised = [
        m for a in ASSETS for m in result.asset_materializations_for_node(a.key.path[-1])
    ]
    evaluations = result.get_asset_check_evaluations()
    assert (len(materialised), len(evaluations)) == (len(ASSETS), CHECK_COUNT)
    assert {m.partition for m in materialised} == {PARTITION}
    assert {m.metadata["period"].value for m in materialised} == {"2026-W42"}
    assert {e.metadata["period"].value for e in evaluations} == {"2026-W42"}


def test_every_asset_and_check_description_says_how_partitions_name_weeks():
    graph = project().resolve_asset_graph()
    descriptions = [graph.get(key).description for key in graph.get_all_asset_keys()]
    descriptions += [graph.get_check_spec(key).description for key in graph.asset_check_keys]

    assert len(descriptions) >= 12
    for description in descriptions:
        assert "partition 2026-W42-1 is period 2026-W42" in " ".join((description or "").split())


def test_cleanup_work_is_on_digest_cleanup_and_the_week_on_both(week_with_failures):
    result = week_with_failures.result

    deliveries, cleanup = metadata(result, "digest_deliveries"), metadata(result, "digest_cleanup")
    assert [k for k in CLEANUP_ONLY if k in deliveries] == []
    assert all(k in cleanup for k in CLEANUP_ONLY)
    assert cleanup["cleaned"] == cleanup["this_run_cleaned"] == 3
    # the deliveries' figures are the week's before this run's cleanup: sent, not yet cleaned
    assert (deliveries["sent"], deliveries["cleaned"], deliveries["delivered"]) == (3, 0, 3)
    assert cleanup["delivered"] == deliveries["delivered"]


def test_cleanup_lag_is_the_time_from_sent_to_cleaned(world_of):
    world = world_of(3)
    for n in (1, 2):
        world.mailer.script(key_of(n), SendOutcome.failed(FailureClass.TRANSIENT, "smtp:451"))
    world.materialize(selection=[*BEFORE_DELIVERY, "digest_deliveries"])
    world.clock.advance(timedelta(hours=1))
    world.materialize(selection=["digest_deliveries"])
    world.clock.advance(timedelta(hours=2))
    result = world.materialize(selection=["digest_cleanup"])

    cleanup = metadata(result, "digest_cleanup")
    # the two retried items were sent 2 h before cleanup, the other 3 h before
    assert (cleanup["cleaned"], cleanup["cleanup_lag_p50_s"], cleanup["cleanup_lag_max_s"]) == (
        3,
        7200.0,
        10800.0,
    )


def test_delivered_fraction_is_sent_and_cleaned_over_eligible_from_the_ledger(world_of):
    world, first = materialised_week_with_failures(world_of)
    deliveries = metadata(first, "digest_deliveries")
    assert (deliveries["delivered"], deliveries["delivered_fraction"]) == (3, 0.6)
    assert deliveries["delivered_pct"] == "60.0 % of 5 eligible"

    # the retry is sent by the next run, next to the three already cleaned
    world.clock.advance(timedelta(hours=2))
    again = metadata(world.materialize(selection=DELIVERY_AND_CLEANUP), "digest_deliveries")

    counts, snapshot = world.ledger.state_counts(W42), world.ledger.snapshot(W42)
    assert snapshot is not None
    assert (counts[DeliveryState.CLEANED], counts[DeliveryState.FAILED]) == (
        4,
        1,
    )  # cleanup moved sent to cleaned
    assert (again["sent"], again["delivered"]) == (1, 4)
    assert again["delivered_fraction"] == pytest.approx(
        (counts.get(DeliveryState.SENT, 0) + counts[DeliveryState.CLEANED])
        / snapshot.eligible_count
    )
    assert again["delivered_pct"] == "80.0 % of 5 eligible"


def test_rates_read_as_percentages_of_their_base(week_with_failures):
    result = week_with_failures.result

    deliveries = metadata(result, "digest_deliveries")
    assert {fc.value: deliveries[f"{fc.value}_attempts_pct"] for fc in FailureClass} == {
        "transient": "20.0 % of 5 finished attempts",
        "throttled": "0.0 % of 5 finished attempts",
        "permanent": "20.0 % of 5 finished attempts",
        "unknown": "0.0 % of 5 finished attempts",
    }
    assert deliveries["transient_attempts_fraction"] == 0.2


def test_a_retry_due_later_is_sent_by_the_next_materialisation(world_of):
    world = world_of(3)
    world.mailer.script(key_of(1), SendOutcome.failed(FailureClass.TRANSIENT, "smtp:451"))
    world.materialize()
    world.clock.advance(timedelta(hours=2))
    again = world.materialize(selection=DELIVERY_AND_CLEANUP)

    deliveries = metadata(again, "digest_deliveries")
    assert (deliveries["this_run_claimed"], deliveries["sent"]) == (1, 1)
    assert deliveries["this_run_found_already_delivered"] == 2
    assert world.mailer.deliveries_for(key_of(1)) == 1
    cleanup = metadata(again, "digest_cleanup")
    assert (cleanup["this_run_cleaned"], cleanup["cleaned"]) == (1, 3)
