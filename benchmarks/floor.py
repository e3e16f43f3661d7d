"""The SQL floor: only the ledger's writes for one week, as set-based statements, on PostgreSQL.

The same schema (migrated by the project) and the same rows as an end-to-end week, but no
Dagster, no Python per item and no mail: COPY for the snapshot, digest rows and cleanup rows,
`INSERT … SELECT` for the work items, and each delivery transition (claim, attempts started,
outcomes recorded) as one statement per chunk of `--chunk` items, in separate transactions as
the project commits them. What the project reaches is then a percentage of this machine's
limit (`python -m benchmarks --only floor`, or `python -m benchmarks.floor --customers N`).
Beside it, one digest's compose time measured now: the worker's Python has a speed of its own.
"""

import argparse
import json
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from benchmarks import common, compose, tables
from digest_pipeline.adapters.sql.engine import create_ledger_engine, migrate

CUSTOMERS = 100_000
CHUNK = 2_000
ROWS_PER_CUSTOMER = 4
PERIOD = "2026-W42"
COLUMNS = (
    "customers",
    "chunk",
    "content_s",
    "items_s",
    "deliveries_s",
    "cleanup_s",
    "total_s",
    "compose_us",
)
T = datetime(2026, 10, 12, 6, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Options:
    customers: int = CUSTOMERS
    chunk: int = CHUNK
    json_dir: Path = field(default=common.DEFAULT_JSON_DIR)


def _payload(n: int, position: int) -> str:
    # the shape content generation writes: a product's title, price, links, the customer's name
    return json.dumps(
        {
            "product_id": f"prod-{(n + position) % 60:04d}",
            "title": f"Walnut chopping board, oiled, {position + 1} of 4",
            "price": "19.90",
            "currency": "EUR",
            "url": f"https://shop.example/p/prod-{(n + position) % 60:04d}",
            "image_url": f"https://cdn.shop.example/p/prod-{(n + position) % 60:04d}.jpg",
            "customer_name": f"Shopper {n}",
        }
    )


def _chunks(conn: psycopg.Connection[Any], size: int) -> Iterator[list[tuple[str, int]]]:
    """Claims due items `size` at a time, as `claim_due` does; stops when none is left."""
    while True:
        with conn.transaction():
            claimed = conn.execute(
                """
                UPDATE work_items w SET state = 'claimed', lease_owner = 'floor',
                       lease_token = w.lease_token + 1, lease_expires_at = %(t)s,
                       next_attempt_at = NULL, updated_at = %(t)s
                  FROM (SELECT operation_key FROM work_items
                         WHERE period = %(p)s AND state IN ('pending', 'retry_scheduled')
                           AND next_attempt_at <= %(t)s
                         ORDER BY next_attempt_at, operation_key
                         LIMIT %(n)s FOR UPDATE SKIP LOCKED) due
                 WHERE w.operation_key = due.operation_key
             RETURNING w.operation_key, w.lease_token
                """,
                {"t": T, "p": PERIOD, "n": size},
            ).fetchall()
        if not claimed:
            return
        yield claimed


def measure(conninfo: str, customers: int, chunk: int) -> dict[str, Any]:
    """The phases' wall times for one week of `customers`, every one eligible."""
    spans: dict[str, float] = {}
    with psycopg.connect(conninfo) as conn:
        started = time.perf_counter()
        with conn.transaction():
            conn.execute(
                "INSERT INTO period_runs VALUES (%s, 'floor', %s, %s, 'f', NULL)",
                (PERIOD, T, customers),
            )
            with conn.cursor().copy(
                "COPY eligibility_snapshot (period, customer_id, recipient) FROM STDIN"
            ) as copy:
                for n in range(customers):
                    copy.write_row((PERIOD, f"customer-{n:07d}", f"shopper.{n}@mailbox.example"))
            with conn.cursor().copy(
                "COPY digest_rows (operation_key, period, customer_id, position, payload)"
                " FROM STDIN"
            ) as copy:
                for n in range(customers):
                    key = f"digest:{PERIOD}:customer-{n:07d}"
                    for position in range(ROWS_PER_CUSTOMER):
                        copy.write_row(
                            (key, PERIOD, f"customer-{n:07d}", position, _payload(n, position))
                        )
        spans["content_s"] = time.perf_counter() - started

        started = time.perf_counter()
        with conn.transaction():
            conn.execute(
                """
                INSERT INTO work_items (operation_key, period, customer_id, state, attempts,
                       budget_used, lease_token, created_at, updated_at, next_attempt_at)
                SELECT 'digest:' || period || ':' || customer_id, period, customer_id,
                       'pending', 0, 0, 0, %(t)s, %(t)s, %(t)s
                  FROM eligibility_snapshot WHERE period = %(p)s
                """,
                {"t": T, "p": PERIOD},
            )
            conn.execute("ANALYZE work_items")
        spans["items_s"] = time.perf_counter() - started

        started = time.perf_counter()
        for claimed in _chunks(conn, chunk):
            keys = [k for k, _ in claimed]
            tokens = [t for _, t in claimed]
            with conn.transaction():
                conn.execute(
                    """
                    UPDATE work_items w SET attempts = w.attempts + 1,
                           budget_used = w.budget_used + 1, last_attempt_at = %(t)s,
                           first_attempt_at = coalesce(w.first_attempt_at, %(t)s),
                           window_started_at = coalesce(w.window_started_at, %(t)s)
                      FROM unnest(%(k)s::text[], %(tok)s::int[]) v(k, tok)
                     WHERE w.operation_key = v.k AND w.lease_token = v.tok
                       AND w.state = 'claimed'
                    """,
                    {"t": T, "k": keys, "tok": tokens},
                )
                ids = conn.execute(
                    """
                    INSERT INTO attempts (operation_key, number, lease_token, worker, started_at,
                                          duplicate)
                    SELECT v.k, 1, v.tok, 'floor', %(t)s, false
                      FROM unnest(%(k)s::text[], %(tok)s::int[]) v(k, tok)
                 RETURNING attempt_id
                    """,
                    {"t": T, "k": keys, "tok": tokens},
                ).fetchall()
            with conn.transaction():
                conn.execute(
                    """
                    UPDATE attempts a SET finished_at = %(t)s, outcome = 'sent',
                           provider_message_id = 'msg-' || a.attempt_id
                      FROM unnest(%(ids)s::bigint[]) v(id)
                     WHERE a.attempt_id = v.id AND a.finished_at IS NULL
                    """,
                    {"t": T, "ids": [i for (i,) in ids]},
                )
                conn.execute(
                    """
                    UPDATE work_items w SET state = 'sent', sent_at = %(t)s, updated_at = %(t)s,
                           lease_owner = NULL, lease_expires_at = NULL
                      FROM unnest(%(k)s::text[], %(tok)s::int[]) v(k, tok)
                     WHERE w.operation_key = v.k AND w.lease_token = v.tok
                       AND w.state = 'claimed'
                    """,
                    {"t": T, "k": keys, "tok": tokens},
                )
        spans["deliveries_s"] = time.perf_counter() - started

        started = time.perf_counter()
        with conn.transaction():
            conn.execute(
                """
                INSERT INTO cleanups (operation_key, period, mode, rows, claimed_at,
                                      completed_at)
                SELECT operation_key, period, 'delete', %(r)s, %(t)s, %(t)s
                  FROM work_items WHERE period = %(p)s AND state = 'sent'
                """,
                {"t": T, "p": PERIOD, "r": ROWS_PER_CUSTOMER},
            )
            conn.execute("DELETE FROM digest_rows WHERE period = %s", (PERIOD,))
            conn.execute(
                "UPDATE work_items SET state = 'cleaned', cleaned_at = %(t)s"
                " WHERE period = %(p)s AND state = 'sent'",
                {"t": T, "p": PERIOD},
            )
        spans["cleanup_s"] = time.perf_counter() - started
        (cleaned,) = conn.execute(
            "SELECT count(*) FROM work_items WHERE state = 'cleaned'"
        ).fetchone() or (0,)
    if cleaned != customers:
        raise RuntimeError(f"floor cleaned {cleaned} of {customers} items")
    total = sum(spans.values())
    return {
        "customers": customers,
        "chunk": chunk,
        **{k: round(v, 2) for k, v in spans.items()},
        "total_s": round(total, 2),
        "cleaned": cleaned,
    }


def run(opts: Options) -> dict[str, Any]:
    if not common.pg_available():
        print(f"\nSQL floor: {common.SKIPPED_PG}")
        return tables.publish("floor", [], opts, skipped=common.SKIPPED_PG)
    # the worker's side of the machine in the same sitting, first: the database is idle then,
    # not still writing out the week the floor leaves behind
    compose_us = round(compose.compose_us(), 1)
    with common.workdir("floor") as work, common.backend("postgres", work) as backend:
        engine = create_ledger_engine(backend.ledger_url)
        try:
            migrate(engine)
        finally:
            engine.dispose()
        row = measure(common.conninfo(backend.ledger_url), opts.customers, opts.chunk)
    row["compose_us"] = compose_us
    tables.print_table(
        "SQL floor: the ledger's writes for one week as set-based statements (PostgreSQL, no"
        " Dagster, no Python per item); compare with the end-to-end rows' phases. compose_us:"
        " one digest composed on this machine now, the per-item Python floor",
        [row],
        COLUMNS,
    )
    return tables.publish("floor", [row], opts)


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.floor", description=__doc__)
    p.add_argument("--customers", type=int, default=CUSTOMERS)
    p.add_argument("--chunk", type=int, default=CHUNK)
    p.add_argument("--json-dir", type=Path, default=common.DEFAULT_JSON_DIR)
    a = p.parse_args(argv)
    run(Options(a.customers, a.chunk, a.json_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
