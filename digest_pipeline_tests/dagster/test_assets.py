"""A week materialised in process with fakes bound as resources: counts, re-runs and fan-out."""

from datetime import timedelta

from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline_tests.builders import customer_id, key_of, make_customer
from digest_pipeline_tests.dagster.harness import DELIVERY_AND_CLEANUP, checks, metadata


def mapped_steps(result) -> list[str]:
    return sorted(
        e.step_key
        for e in result.all_events
        if e.is_step_success and e.step_key.startswith("digest_deliveries.deliver_batch[")
    )


def test_a_week_materialises_and_records_its_counts(world_of):
    world = world_of(5)
    result = world.materialize()

    assert result.success
    snapshot = metadata(result, "eligibility_snapshot")
    assert (snapshot["eligible"], snapshot["considered"], snapshot["reused"]) == (5, 5, False)
    assert snapshot["selection_run_id"] == result.run_id
    assert metadata(result, "digest_content") == {
        "customers": 5,
        "rows": 20,
        "skipped_existing": 0,
        "without_picks": 0,
    }
    assert metadata(result, "digest_work_items") == {"created": 5, "existing": 0}
    deliveries = metadata(result, "digest_deliveries")
    assert {k: deliveries[k] for k in ("eligible", "sent", "claimed_this_run", "batches")} == {
        "eligible": 5,
        "sent": 5,
        "claimed_this_run": 5,
        "batches": 1,
    }
    assert deliveries["skipped_already_sent"] == 0
    cleanup = metadata(result, "digest_cleanup")
    assert (cleanup["cleaned"], cleanup["rows"], cleanup["held_back"]) == (5, 20, 0)
    assert len(world.mailer.deliveries) == 5
    assert all(e.passed for e in checks(result).values())
    assert len(checks(result)) == 7
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
    assert snapshot["reused"] is True
    assert "reused the snapshot frozen by run" in snapshot["note"]
    assert metadata(again, "digest_content")["skipped_existing"] == 5
    assert metadata(again, "digest_work_items") == {"created": 0, "existing": 5}
    deliveries = metadata(again, "digest_deliveries")
    assert (deliveries["skipped_already_sent"], deliveries["claimed_this_run"]) == (5, 0)
    assert deliveries["batches"] == 0
    assert mapped_steps(again) == []
    cleanup = metadata(again, "digest_cleanup")
    assert (cleanup["cleaned"], cleanup["already_cleaned"]) == (0, 5)
    assert world.mailer.sends == 5
    assert world.mailer.duplicate_deliveries == 0


def test_batch_size_one_gives_one_mapped_step_per_customer(world_of):
    world = world_of(4)
    result = world.materialize(batch_size=1)

    assert mapped_steps(result) == [
        f"digest_deliveries.deliver_batch[batch_{i:04d}]" for i in range(4)
    ]
    assert metadata(result, "digest_deliveries")["batches"] == 4
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
    assert (deliveries["eligible"], deliveries["sent"], deliveries["batches"]) == (0, 0, 0)
    assert metadata(result, "digest_cleanup")["cleaned"] == 0


def test_a_failed_send_is_a_recorded_state_and_cleanup_keeps_its_rows(world_of):
    world = world_of(5)
    world.mailer.script(key_of(2), SendOutcome.failed(FailureClass.PERMANENT, "smtp:550"))
    world.mailer.script(key_of(4), SendOutcome.failed(FailureClass.TRANSIENT, "smtp:451"))
    result = world.materialize()

    assert result.success
    deliveries = metadata(result, "digest_deliveries")
    assert (deliveries["sent"], deliveries["failed"], deliveries["retry_scheduled"]) == (3, 1, 1)
    assert deliveries["retry_rate_permanent"] == deliveries["retry_rate_transient"] == 0.2
    worst = deliveries["worst_items"].records
    assert [(r.data["customer_id"], r.data["state"]) for r in worst[:2]] == [
        (customer_id(2), "failed"),
        (customer_id(4), "retry_scheduled"),
    ]
    assert worst[0].data["last_failure_class"] == "permanent"
    assert worst[0].data["last_detail"] == "smtp:550"
    cleanup = metadata(result, "digest_cleanup")
    assert (cleanup["cleaned"], cleanup["held_back_failed"]) == (3, 1)
    assert cleanup["held_back_retry_scheduled"] == 1


def test_worst_items_holds_at_most_twenty_rows_worst_first(world_of):
    world = world_of(25)
    for n in (3, 17):
        world.mailer.script(key_of(n), SendOutcome.failed(FailureClass.PERMANENT, "smtp:550"))
    result = world.materialize()

    records = metadata(result, "digest_deliveries")["worst_items"].records
    assert len(records) == 20
    assert [r.data["customer_id"] for r in records[:2]] == [customer_id(3), customer_id(17)]
    assert set(records[0].data) == {
        "key",
        "customer_id",
        "state",
        "attempts",
        "last_failure_class",
        "last_detail",
    }


def test_a_retry_due_later_is_sent_by_the_next_materialisation(world_of):
    world = world_of(3)
    world.mailer.script(key_of(1), SendOutcome.failed(FailureClass.TRANSIENT, "smtp:451"))
    world.materialize()
    world.clock.advance(timedelta(hours=2))
    again = world.materialize(selection=DELIVERY_AND_CLEANUP)

    deliveries = metadata(again, "digest_deliveries")
    assert (deliveries["claimed_this_run"], deliveries["sent"]) == (1, 1)
    assert deliveries["skipped_already_sent"] == 2
    assert world.mailer.deliveries_for(key_of(1)) == 1
    assert metadata(again, "digest_cleanup")["cleaned"] == 1
