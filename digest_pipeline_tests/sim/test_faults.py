"""Each injected fault shows up in its own count, read from the provider's store and the ledger."""

from datetime import timedelta

from digest_pipeline_tests.sim.conftest import N, cell, config, row_of


def test_no_faults_deliver_every_customer_once_and_clean_every_item():
    row = row_of(config())
    assert (row["provider_deliveries"], row["keys_delivered"], row["cleaned"]) == (N, N, N)
    assert row["attempts"] == N
    assert row["duplicate_extra"] == row["unknown_left"] == row["dead_lettered"] == 0
    assert row["drained"]
    assert row["invariants_ok"]


def test_transient_failures_are_retried_and_counted_as_transient():
    row = row_of(config(transient_rate=0.3))
    assert row["failed_transient"] > 0
    assert row["attempts"] == N + row["failed_transient"]
    assert row["transient_fraction"] == 1.0
    assert row["transient_keys"] > 0
    assert row["transient_recovered"] == 1.0
    assert 0 < row["retry_delay_p50_s"] <= row["retry_delay_p95_s"] <= row["retry_delay_max_s"]
    assert (row["cleaned"], row["duplicate_extra"]) == (N, 0)


def test_throttled_failures_wait_at_least_the_providers_retry_after():
    row = row_of(config(throttle_rate=0.2))
    assert row["failed_throttled"] > 0
    assert row["transient_fraction"] == 0.0
    assert row["retry_delay_p50_s"] >= 60  # THROTTLE_RETRY_AFTER
    assert row["cleaned"] == N


def test_permanent_failures_are_dead_lettered_once_and_never_retried():
    row = row_of(config(permanent_rate=0.1))
    failed = row["failed_permanent"]
    assert failed > 0
    assert row["failed"] == row["dl_permanent"] == row["keys_never_delivered"] == failed
    assert row["attempts"] == N
    assert row["cleaned"] == N - failed


def test_a_timeout_after_accept_is_unknown_then_reconciled_by_an_idempotent_resend():
    row = row_of(config(timeout_after_accept_rate=0.05))
    timeouts = row["timeouts_after_accept"]
    assert timeouts > 0
    assert row["failed_unknown"] == row["unknown_episodes"] == timeouts
    assert row["reconciled_idempotent_resend"] == timeouts
    assert row["provider_suppressed"] == timeouts  # the resend was deduplicated by key
    assert (row["duplicate_extra"], row["unknown_left"], row["cleaned"]) == (0, 0, N)


def test_a_timeout_after_accept_stays_unknown_without_an_idempotent_provider():
    row = row_of(config(timeout_after_accept_rate=0.05, provider_idempotent=False))
    timeouts = row["timeouts_after_accept"]
    assert timeouts > 0
    assert row["unknown_left"] == timeouts
    assert row["keys_delivered"] == N  # each was accepted once, and never sent blind again
    assert row["duplicate_extra"] == 0
    assert row["cleaned"] == N - timeouts
    assert row["invariants_ok"]


def test_an_outage_is_a_spike_of_retries_and_then_recovers():
    quiet = row_of(config(transient_rate=0.05))
    outage = row_of(
        config(transient_rate=0.05, outage_start=timedelta(0), outage_length=timedelta(minutes=2))
    )
    assert outage["failed_transient"] > N  # every send inside the outage was refused
    assert outage["max_retry_wakes_per_s"] > 5 * quiet["max_retry_wakes_per_s"]
    assert outage["transient_recovered"] == 1.0
    assert (outage["cleaned"], outage["duplicate_extra"]) == (N, 0)


def test_a_crash_after_send_is_recovered_with_no_duplicate_at_an_idempotent_provider():
    row = row_of(config(crash_after_send_rate=0.05))
    crashes = row["crashes_after_send"]
    assert crashes > 0
    assert row["lease_recovered_unknown"] >= crashes  # found by the sweep after the lease
    assert row["attempts_open"] == crashes  # the dead worker's attempt is never closed
    assert row["crash_keys_unsent"] == 0
    assert (row["duplicate_extra"], row["keys_delivered"], row["cleaned"]) == (0, N, N)
    assert row["invariants_ok"]


def test_a_lost_cleanup_acknowledgement_runs_cleanup_again_but_completes_it_once_per_key():
    row = row_of(config(crash_after_cleanup_commit_rate=0.2))
    lost = row["cleanup_acks_lost"]
    assert lost > 0
    assert row["cleanup_attempts"] == N + lost > row["cleanups_completed"] == N
    assert row["inv_at_most_one_cleanup_per_key"]


def test_a_claim_handed_to_a_second_worker_is_stopped_by_the_ledgers_fencing():
    row = row_of(
        config(duplicate_delivery_rate=0.3, provider_idempotent=False), cell(lease_seconds=5)
    )
    assert row["duplicate_handoffs"] > 0
    assert row["duplicate_handoff_attempts"] == 0  # no redelivered claim started an attempt
    assert (row["duplicate_extra"], row["provider_suppressed"]) == (0, 0)
    assert row["keys_delivered"] == row["cleaned"] == N


def test_a_lease_shorter_than_a_batch_expires_under_the_worker():
    # 32 claims x 200 ms = 6.4 s of sending per batch: a 5 s lease runs out mid-batch
    short = row_of(config(), cell(lease_seconds=5))
    long = row_of(config(), cell(lease_seconds=120))
    assert short["lease_recovered_requeued"] > 0
    assert short["lease_recovered_unknown"] > 0  # the send in flight when the lease ran out
    assert short["late_results"] > 0
    assert short["lost_races"] > 0
    assert short["reconciled_ledger_attempt"] > 0
    assert (short["duplicate_extra"], short["cleaned"]) == (0, N)
    assert (long["lease_recovered_requeued"], long["lost_races"], long["unknown_episodes"]) == (
        0,
        0,
        0,
    )
