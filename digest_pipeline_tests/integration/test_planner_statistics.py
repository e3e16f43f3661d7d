"""A bulk write leaves PostgreSQL statistics that describe it, so the next phase's reads use keys.

Delivery reads a period's digest rows and recipients by key, a wave at a time, moments after
content generation and the freeze wrote them, long before autovacuum looks. Planned without
statistics, each wave's read of its digest rows was a parallel scan of every row of the table
(30 ms a wave at 100,000 customers), and cleanup's `sent → cleaned` went through the state index
over every sent item of the ledger, each chunk.
"""

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, event, text

from digest_pipeline.adapters.sql import base, bulk
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.adapters.sql.schema import attempts
from digest_pipeline.domain.model import INVARIANTS
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.rigs.seeding import W42
from digest_pipeline_tests.builders import ROWS_PER_CUSTOMER, seed_period
from digest_pipeline_tests.conftest import T0, truncate_pg

pytestmark = pytest.mark.integration

#: customers: above `ANALYZE_AFTER` rows in every table the phases write
CUSTOMERS = 6_000


def _nodes(explained: Any) -> Iterator[dict[str, Any]]:
    """Every node of an `EXPLAIN (FORMAT JSON)` answer (decoded or not)."""
    [plan] = json.loads(explained) if isinstance(explained, str) else explained
    todo = [plan["Plan"]]
    while todo:
        node = todo.pop()
        yield node
        todo.extend(node.get("Plans", []))


def _read(explained: Any, table: str) -> int:
    """Rows the scans of `table` in an analysed plan returned or filtered out, over all loops."""
    return sum(
        (n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * n.get("Actual Loops", 1)
        for n in _nodes(explained)
        if n.get("Relation Name") == table and "Scan" in n["Node Type"]
    )


def _analysed(engine: Engine, statement: str, parameters: Any) -> Any:
    """`EXPLAIN (ANALYZE, FORMAT JSON)` of a captured statement, run and rolled back."""
    with engine.connect() as conn, conn.begin() as tx:
        sql = "EXPLAIN (ANALYZE, FORMAT JSON) " + statement
        explained = conn.exec_driver_sql(sql, parameters).scalar_one()
        tx.rollback()
    return explained


def _plan_nodes(engine: Engine, sql: str, **params: Any) -> Iterator[dict[str, Any]]:
    with engine.connect() as conn:
        explained = conn.execute(text(f"EXPLAIN (FORMAT JSON) {sql}"), params).scalar_one()
    return _nodes(explained)


def _scans(engine: Engine, sql: str, **params: Any) -> set[tuple[str, str]]:
    """(node type, relation) of every scan in the plan of `sql`."""
    return {
        (n["Node Type"], n.get("Relation Name", ""))
        for n in _plan_nodes(engine, sql, **params)
        if "Scan" in n["Node Type"]
    }


def _planned(engine: Engine, table: str) -> float:
    with engine.connect() as conn:
        q = text("SELECT reltuples FROM pg_class WHERE relname = :t")
        return float(conn.execute(q, {"t": table}).scalar_one())


@contextmanager
def _sent(engine: Engine, marker: str) -> Iterator[list[tuple[str, Any]]]:
    """The statements holding `marker` that the block sends to `engine`, with their parameters."""
    seen: list[tuple[str, Any]] = []

    def capture(conn, cursor, statement, parameters, context, executemany) -> None:
        if marker in statement:
            seen.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", capture)


@pytest.fixture
def seeded(pg_engine: Engine) -> SqlLedger:
    truncate_pg(pg_engine)
    with pg_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        # as a week after the last cleanup left them: analysed while empty
        conn.execute(text("ANALYZE digest_rows, eligibility_snapshot, work_items"))
    ledger = SqlLedger(pg_engine)
    seed_period(ledger, CUSTOMERS)
    return ledger


def test_the_planner_knows_the_snapshot_and_the_digest_rows_just_written(
    seeded: SqlLedger,
) -> None:
    with seeded.engine.connect() as conn:
        planned: dict[str, float] = dict(
            conn.execute(
                text(
                    "SELECT relname, reltuples FROM pg_class"
                    " WHERE relname IN ('eligibility_snapshot', 'digest_rows')"
                )
            ).all()
        )
    assert planned == {
        "eligibility_snapshot": CUSTOMERS,
        "digest_rows": CUSTOMERS * ROWS_PER_CUSTOMER,
    }


def test_a_wave_reads_its_digest_rows_by_key(seeded: SqlLedger) -> None:
    keys = [f"digest:{W42}:customer-{n:04d}" for n in range(3000, 3064)]
    scans = _scans(
        seeded.engine,
        "SELECT operation_key, position, payload FROM digest_rows WHERE operation_key = ANY(:keys)",
        keys=keys,
    )
    assert ("Seq Scan", "digest_rows") not in scans, scans


def test_a_claim_late_in_a_week_reads_about_the_rows_it_claims(seeded: SqlLedger) -> None:
    # Joined to the locked due keys, the claim's UPDATE was planned from statistics read while
    # every item was pending as a walk of the whole key index past every item already claimed
    # or sent: each claim of a week slower than the one before. It finds the chosen keys
    # through the primary key now (`= ANY` of the locked keys, `SqlWorkQueue.claim_due`).
    engine, claim, pending = seeded.engine, 100, DeliveryState.PENDING
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ANALYZE work_items"))  # all pending, as delivery begins
    now, lease = T0 + timedelta(hours=1), timedelta(minutes=10)
    # three quarters of the week claimed: the keys a walk of the key index passes first
    while seeded.state_counts(W42).get(pending, 0) > CUSTOMERS // 4:
        seeded.claim_due(now, "w1", lease, 500, W42)
    assert seeded.state_counts(W42).get(pending) == CUSTOMERS // 4

    with _sent(engine, "SKIP LOCKED") as seen:
        claimed = seeded.claim_due(now, "w2", lease, claim, W42)
    assert len(claimed) == claim
    [(statement, parameters)] = seen

    # the same statement analysed on the same data (the claim given back first), rolled back
    with engine.connect() as conn, conn.begin() as tx:
        conn.execute(
            text(
                "UPDATE work_items SET state = 'pending', lease_owner = NULL, "
                "lease_expires_at = NULL, next_attempt_at = :at WHERE operation_key = ANY(:keys)"
            ),
            {"at": T0, "keys": [str(c.key) for c in claimed]},
        )
        explained = conn.exec_driver_sql(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + statement, parameters
        ).scalar_one()
        tx.rollback()
    # rows the scans of work_items returned or filtered out: the due index's for the lock,
    # then one primary-key probe a claimed key (the old join read 6,100 here)
    assert _read(explained, "work_items") <= 3 * claim


def _live_rows(engine: Engine, table: str) -> int:
    with engine.connect() as conn:
        q = text("SELECT n_live_tup FROM pg_stat_user_tables WHERE relname = :t")
        return int(conn.execute(q, {"t": table}).scalar_one())


def test_a_table_another_session_holds_is_left_unanalysed_and_the_check_still_answers(
    seeded: SqlLedger, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(base, "ANALYZE_LOCK_TIMEOUT_MS", 200)
    caplog.set_level(logging.WARNING, logger=base.logger.name)
    engine = seeded.engine
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ANALYZE attempts"))  # empty: the planner counts no attempt
    stale_then = _planned(engine, "attempts")
    with engine.connect() as vacuum:
        # held as an operator's VACUUM holds it, before the rows arrive, so autovacuum cannot
        # analyse them either
        held = vacuum.begin()
        vacuum.execute(text("LOCK TABLE attempts IN SHARE UPDATE EXCLUSIVE MODE"))
        try:
            with engine.begin() as conn:
                conn.execute(
                    text(
                        "INSERT INTO attempts (operation_key, number, lease_token, worker,"
                        " started_at, duplicate)"
                        " SELECT operation_key, 1, 0, 'w', now(), false FROM work_items"
                    )
                )
                conn.execute(text("SELECT pg_stat_force_next_flush()"))
            # the collector's count is what the refresh reads: wait until it shows the rows
            deadline = time.monotonic() + 30
            while _live_rows(engine, "attempts") < CUSTOMERS and time.monotonic() < deadline:
                time.sleep(0.05)
            results = seeded.check_invariants(W42, T0)
        finally:
            held.rollback()
    assert [r.name for r in results] == list(INVARIANTS)  # answered, not failed or hung
    assert "statistics of attempts not refreshed" in caplog.text
    assert _planned(engine, "attempts") == stale_then


def test_a_wave_of_attempts_is_closed_through_their_keys_whatever_the_statistics(
    seeded: SqlLedger,
) -> None:
    # Statistics read while every attempt was closed (any week after the first) say `IS NULL`
    # finds one row. Guarded by `finished_at IS NULL`, the closing UPDATE scanned the whole
    # table for that row and joined each open attempt to every row of the wave: 14-36 ms a
    # wave of 256 in a 100,000-customer week. The guard is checked after each key's probe now.
    engine, wave, history = seeded.engine, 256, 7
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO attempts (operation_key, number, lease_token, worker, started_at,"
                " finished_at, outcome, duplicate)"
                " SELECT operation_key, n, 0, 'w', now(), now(), 'sent', false"
                " FROM work_items, generate_series(1, :history) AS n"
            ),
            {"history": history},
        )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ANALYZE attempts"))
    with engine.begin() as conn:
        opened = (
            conn.execute(
                text(
                    "INSERT INTO attempts (operation_key, number, lease_token, worker, started_at,"
                    " duplicate)"
                    " SELECT operation_key, :n, 0, 'w', now(), false FROM work_items"
                    " ORDER BY operation_key LIMIT :wave RETURNING attempt_id"
                ),
                {"n": history + 1, "wave": wave},
            )
            .scalars()
            .all()
        )
    closing = [((a,), {"finished_at": T0, "outcome": "sent"}) for a in opened]
    with _sent(engine, "UPDATE attempts") as seen, engine.connect() as conn, conn.begin() as tx:
        matched = bulk.update_many(
            conn,
            attempts,
            ("attempt_id",),
            {"finished_at": None, "outcome": None},
            closing,
            unset=("finished_at",),
        )
        tx.rollback()
    assert matched == wave
    [(statement, parameters)] = seen
    explained = _analysed(engine, statement, parameters)
    # rows of attempts read or filtered out, and pairs a join compared and threw away: one
    # primary-key probe an attempt (the `IS NULL` filter read the table and compared 65,280)
    read = sum(
        (
            n.get("Actual Rows", 0) * (n.get("Relation Name") == "attempts")
            + n.get("Rows Removed by Filter", 0)
            + n.get("Rows Removed by Join Filter", 0)
        )
        * n.get("Actual Loops", 1)
        for n in _nodes(explained)
    )
    assert read <= 3 * wave, read


def test_a_claim_in_a_week_the_statistics_have_not_seen_finds_its_keys_by_key(
    seeded: SqlLedger,
) -> None:
    # Enqueued after the last analysis (the refresh is skipped until a table doubles; autovacuum
    # comes when it comes), a new week's items are, to the planner, a few rows. Were the claim's
    # UPDATE to re-check its CTE's due clause, the planner would read the due index and test each
    # row's key against the 2,048 locked keys one by one, a slow claim once a ledger holds many
    # weeks (benchmarks/weeks.py).
    engine, claim, later = seeded.engine, 2_048, Period(2026, 43)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ANALYZE work_items"))  # this week only
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO work_items (operation_key, period, customer_id, state, attempts,"
                " budget_used, lease_token, created_at, updated_at, next_attempt_at)"
                " SELECT 'digest:' || :p || ':' || customer_id, :p, customer_id, 'pending', 0, 0,"
                " 0, created_at, updated_at, created_at FROM work_items WHERE period = :w"
            ),
            {"p": str(later), "w": str(W42)},
        )
    with _sent(engine, "SKIP LOCKED") as seen:
        claimed = seeded.claim_due(T0 + timedelta(days=8), "w", timedelta(minutes=10), claim, later)
    assert len(claimed) == claim
    [(statement, parameters)] = seen
    with engine.connect() as conn:
        explained = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + statement, parameters)
        plan = list(_nodes(explained.scalar_one()))
    # the locked keys are looked up (an index condition), never tested row by row (a filter)
    filters = [n.get("Filter", "") for n in plan if n.get("Relation Name") == "work_items"]
    assert not any("operation_key" in f for f in filters), filters


def test_a_late_week_reads_its_own_items_and_attempts_not_the_history(seeded: SqlLedger) -> None:
    # Nine earlier weeks of the same shop before W42, each item with its attempt. A week's keys
    # sort after every earlier week's, so a period's first page in key order would walk the key
    # index past all of them, and invariants and metrics that hash the week's items would scan
    # every attempt of the ledger: a cost that grows with every week a ledger keeps.
    engine, page, weeks = seeded.engine, 500, 9
    earlier = [Period(2026, W42.week - k) for k in range(1, weeks + 1)]
    with engine.begin() as conn:
        for p in earlier:
            conn.execute(
                text(
                    "INSERT INTO work_items (operation_key, period, customer_id, state, attempts,"
                    " budget_used, lease_token, created_at, updated_at, next_attempt_at, sent_at)"
                    " SELECT 'digest:' || :p || ':' || customer_id, :p, customer_id, 'sent', 1, 1,"
                    " 1, created_at, updated_at, created_at, created_at"
                    " FROM work_items WHERE period = :w"
                ),
                {"p": str(p), "w": str(W42)},
            )
        conn.execute(
            text(
                "INSERT INTO attempts (operation_key, number, lease_token, worker, started_at,"
                " finished_at, outcome, duplicate)"
                " SELECT operation_key, 1, 1, 'w', now(), now(), 'sent', false FROM work_items"
            )
        )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ANALYZE work_items, attempts"))

    with _sent(engine, "SELECT") as seen:
        next(iter(seeded.iter_item_leases(W42, page=page)))
        seeded.attempt_outcome_counts(W42)
        seeded.check_invariants(W42, T0, names={"no_duplicate_send", "no_silent_timeout"})
    [first_page] = [
        _analysed(engine, *s) for s in seen if "LIMIT" in s[0] and "attempts" not in s[0]
    ]
    assert _read(first_page, "work_items") <= 2 * page
    attempt_reads = [_analysed(engine, *s) for s in seen if "attempts" in s[0]]
    assert len(attempt_reads) >= 4, "two metrics statements and two invariants"
    for plan in attempt_reads:
        # this week's attempts (one an item) and its items, never the nine weeks before
        assert _read(plan, "attempts") <= 2 * CUSTOMERS, json.dumps(plan)[:2000]
        assert _read(plan, "work_items") <= 3 * CUSTOMERS, json.dumps(plan)[:2000]
