"""What the simulator must never hide: `unknown` items, duplicate deliveries, the herd that jitter
prevents. The reported numbers are checked against the provider's own store and the ledger."""

from datetime import timedelta
from typing import Any

from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.rigs.sim.config import PERIOD
from digest_pipeline.rigs.sim.database import scratch_engine
from digest_pipeline.rigs.sim.engine import Simulation
from digest_pipeline.rigs.sim.measure import measure
from digest_pipeline_tests.sim.conftest import cell, config, row_of


def test_without_jitter_retries_wake_together():
    outage: dict[str, Any] = {"outage_start": timedelta(0), "outage_length": timedelta(minutes=2)}
    jittered = row_of(config(**outage), cell(jitter=True))
    herd = row_of(config(**outage), cell(jitter=False))
    assert (jittered["jitter"], herd["jitter"]) == (True, False)
    assert herd["max_retry_wakes_per_s"] > 2 * jittered["max_retry_wakes_per_s"]


def test_a_non_idempotent_provider_with_short_leases_shows_unknowns_and_reports_duplicates():
    cfg = config(
        timeout_after_accept_rate=0.05,
        crash_after_send_rate=0.02,
        duplicate_delivery_rate=0.1,
        provider_idempotent=False,
    )
    with scratch_engine(None) as engine:
        sim = Simulation(cfg, cell(lease_seconds=5), SqlLedger(engine))
        drained = sim.run()
        row: dict[str, Any] = measure(sim.observations(drained), sim.ledger, sim.provider).row
        store = sim.provider.deliveries_per_key()
        unknown = sim.ledger.state_counts(PERIOD).get(DeliveryState.UNKNOWN, 0)
    assert row["unknown_left"] == unknown > 0
    assert row["unknown_episodes"] > row["unknown_left"]  # short leases add settled ones
    assert row["late_results"] > 0
    assert row["duplicate_extra"] == sum(n - 1 for n in store.values())
    assert row["duplicate_keys"] == sum(n > 1 for n in store.values())
    assert row["provider_deliveries"] == sum(store.values())
    assert row["inv_no_duplicate_send"] == (row["duplicate_extra"] == 0)
