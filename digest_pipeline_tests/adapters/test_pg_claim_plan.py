"""A PostgreSQL claim reads about as many rows as it claims, however far into its week it is.

Joined to the locked due keys, the claim's UPDATE was planned from statistics read before the
run (every item pending) as a walk of the whole key index past every item already claimed or
sent, so each claim of a week was slower than the one before. It finds the chosen keys through
the primary key now (`= ANY` of the locked keys, `SqlWorkQueue.claim_due`).
"""

import json
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event, text

from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline_tests.builders import seed_period
from digest_pipeline_tests.conftest import T0, W42, truncate_pg

pytestmark = pytest.mark.integration

ITEMS = 2_000
PENDING = DeliveryState.PENDING
CLAIM = 100


def _work_items_rows_read(plan: dict[str, Any]) -> int:
    """Rows the plan's scans of `work_items` returned or filtered out, over every node."""
    read = 0
    if plan.get("Relation Name") == "work_items" and "Scan" in plan["Node Type"]:
        loops = plan.get("Actual Loops", 1)
        read += (plan["Actual Rows"] + plan.get("Rows Removed by Filter", 0)) * loops
    return read + sum(_work_items_rows_read(child) for child in plan.get("Plans", []))


def test_a_claim_late_in_a_week_reads_about_the_rows_it_claims(pg_engine) -> None:
    truncate_pg(pg_engine)
    ledger = SqlLedger(pg_engine)
    seed_period(ledger, ITEMS)
    with pg_engine.begin() as conn:
        # what the pipeline's statistics say while it delivers: read after enqueue, all pending
        conn.execute(text("ANALYZE work_items"))
    now = T0 + timedelta(hours=1)
    lease = timedelta(minutes=10)
    # three quarters of the week claimed already: the keys a walk of the key index passes first
    while len(ledger.claim_due(now, "w1", lease, 500, W42)) == 500 and (
        ledger.state_counts(W42).get(PENDING, 0) > ITEMS // 4
    ):
        pass
    assert ledger.state_counts(W42).get(PENDING) == ITEMS // 4

    seen: list[tuple[str, Any]] = []

    def capture(conn, cursor, statement, parameters, context, executemany) -> None:
        if "SKIP LOCKED" in statement:
            seen.append((statement, parameters))

    event.listen(pg_engine, "before_cursor_execute", capture)
    try:
        claimed = ledger.claim_due(now, "w2", lease, CLAIM, W42)
    finally:
        event.remove(pg_engine, "before_cursor_execute", capture)
    assert len(claimed) == CLAIM
    [(statement, parameters)] = seen

    # the same statement, analysed on the same data (the claim given back first), rolled back
    with pg_engine.connect() as conn, conn.begin() as tx:
        keys = [str(c.key) for c in claimed]
        conn.execute(
            text(
                "UPDATE work_items SET state = 'pending', lease_owner = NULL, "
                "lease_expires_at = NULL, next_attempt_at = :at WHERE operation_key = ANY(:keys)"
            ),
            {"at": T0, "keys": keys},
        )
        raw = conn.exec_driver_sql(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + statement, parameters
        ).scalar_one()
        tx.rollback()
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    # the due index's rows for the lock, then one primary-key probe a claimed key
    assert _work_items_rows_read(plan) <= 3 * CLAIM
