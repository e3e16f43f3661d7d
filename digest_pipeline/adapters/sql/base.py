"""What every role of the SQL ledger shares: the engine, the dialect and the insert it needs.

The statement fragments the roles compose are in `clauses`, and the writes of many rows at once in
`bulk`.
"""

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Connection, Engine, Select, Table, func, insert, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError

from digest_pipeline.adapters.sql.invariants import Seal
from digest_pipeline.adapters.sql.schema import audit_log, period_runs, work_items
from digest_pipeline.domain.chunks import chunked
from digest_pipeline.domain.errors import DigestError, LostRace, UnknownWorkItem
from digest_pipeline.domain.model import AuditEntry, SnapshotInfo
from digest_pipeline.domain.periods import (
    DEFAULT_INSTANCE,
    OperationKey,
    Period,
    validate_instance_name,
)

logger = logging.getLogger(__name__)
CHUNK = 5_000
#: what `SqlBase._pages` makes of each row
T = TypeVar("T")
#: an enqueue that creates this many items refreshes the table's planner statistics, and a
#: table this many rows past twice its last analysis is analysed again
ANALYZE_AFTER = 1_000
#: how long a statistics refresh waits for a table another VACUUM or ANALYZE holds
ANALYZE_LOCK_TIMEOUT_MS = 2_000
#: keys per `IN (…)` list: far below every driver's bound-parameter limit
KEYS = 500
wi = work_items


def sqlite_statistics_outgrown(conn: Connection, table: Table) -> bool:
    """Whether SQLite's statistics of `table` are missing or outgrown (as PostgreSQL's are judged).

    Outgrown: the table's rows now exceed twice those of its last analysis by `ANALYZE_AFTER`
    (`_refresh_statistics`'s rule). SQLite's ANALYZE reads the whole table and each of its
    indexes, so analysing at every enqueue would slow each one as the ledger's history grows.
    Its statistics (sqlite_stat1) are averages per index prefix, not per value, so a new week's
    rows look like the last week's; refreshed only as the table doubles, all the analyses of a
    growing ledger cost about twice its last one.
    """
    analysed = None
    if conn.exec_driver_sql("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_stat1'").first():
        # each index's row starts with the table's row count at the analysis
        q = text("SELECT max(CAST(stat AS INTEGER)) FROM sqlite_stat1 WHERE tbl = :t")
        analysed = conn.execute(q, {"t": table.name}).scalar()
    if analysed is None:
        return True
    rows = conn.execute(select(func.count()).select_from(table)).scalar_one()
    return bool(rows > ANALYZE_AFTER + 2 * analysed)


def audit_row(e: AuditEntry) -> dict[str, Any]:
    """An audit entry as an `audit_log` row."""
    period = e.period or (e.key.period if e.key else None)
    return {
        "at": e.at,
        "actor": e.actor,
        "action": e.action,
        "period": str(period) if period else None,
        "operation_key": str(e.key) if e.key else None,
        "from_state": e.from_state.value if e.from_state else None,
        "to_state": e.to_state.value if e.to_state else None,
        "reason": e.reason,
    }


class SqlBase:
    """The engine and dialect every role of the SQL ledger works on, and its digest instance."""

    def __init__(self, engine: Engine, instance: str = DEFAULT_INSTANCE) -> None:
        self._engine = engine
        self._instance = validate_instance_name(instance)
        self._pg = engine.dialect.name == "postgresql"
        #: `runtime.executor.WorksElsewhere`: PostgreSQL works in its server, SQLite on this process's CPU
        self.out_of_process = self._pg
        #: PostgreSQL snapshots this ledger fingerprinted whole, by period (`invariants.Seal`);
        #: None on SQLite, which has no row-version stamp to seal with
        self._seals: dict[str, Seal] | None = {} if self._pg else None

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def instance(self) -> str:
        return self._instance

    def _key_prefix(self, period: Period) -> str:
        """`<instance>:<period>:`, what every key of `period` this ledger makes starts with."""
        return f"{self._instance}:{period}:"

    def _pages(
        self, q: Select[Any], key: ColumnElement[str], convert: Callable[[Any], T], page: int
    ) -> Iterator[T]:
        """`q`'s rows as `convert` makes them, read `page` at a time in `key` order.

        Keyset pagination on a unique `key` that `q` selects: each page is its own short read,
        nothing is held open between them, and a page is read only once the caller has taken
        every row of the one before (so what it wrote meanwhile is seen).
        """
        after: str | None = None
        name = key.name
        while True:
            paged = q if after is None else q.where(key > after)
            with self._engine.connect() as conn:
                rows = conn.execute(paged.order_by(key).limit(page)).mappings().all()
                converted = [convert(r) for r in rows]
            yield from converted
            if len(rows) < page:
                return
            after = rows[-1][name]

    def _refresh_statistics(self, tables: Sequence[Table], written: int = 0) -> None:
        """ANALYZEs each table that outgrew what the planner believes it holds (PostgreSQL only).

        A table is stale once its rows (autovacuum's live count, plus `written`: rows this
        process has just written, which that count may not show yet) exceed twice the rows of
        its last analysis by `ANALYZE_AFTER`. A ledger's phases fill tables faster than
        autovacuum looks: content writes a week's digest rows and delivery its attempts, and
        the next reads by key would be planned for the table as it was, empty (a parallel scan
        of every digest row for each wave). Runs in its own short transaction, never inside one
        that holds row locks, so two workers' ANALYZEs can only wait for each other.
        """
        if not self._pg:
            return
        stale = text(
            "SELECT c.relname FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid"
            " WHERE c.oid = ANY(CAST(:names AS regclass[]))"
            " AND s.n_live_tup + :written > :floor + 2 * GREATEST(c.reltuples, 0)"
        )
        names = [t.name for t in tables]
        with self._engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            params = {"names": names, "written": written, "floor": ANALYZE_AFTER}
            todo = list(conn.execute(stale, params).scalars())
            if not todo:
                return
            # An optimisation only, so it never holds the caller up for long nor fails it: a
            # VACUUM that holds the table (an operator's; autovacuum gives way) or a standby
            # leaves the plans as they are, with a warning.
            conn.exec_driver_sql(f"SET lock_timeout = '{ANALYZE_LOCK_TIMEOUT_MS}ms'")
            try:
                for name in todo:
                    quoted = conn.dialect.identifier_preparer.quote(name)
                    try:
                        conn.exec_driver_sql(f"ANALYZE {quoted}")
                    except DBAPIError as e:
                        logger.warning("statistics of %s not refreshed: %s", name, e)
            finally:
                conn.exec_driver_sql("RESET lock_timeout")

    def _insert(self, table: Any) -> postgresql.Insert | sqlite.Insert:
        return postgresql.insert(table) if self._pg else sqlite.insert(table)

    def _snapshot_info(self, conn: Connection, period: Period) -> SnapshotInfo | None:
        r = (
            conn.execute(select(period_runs).where(period_runs.c.period == str(period)))
            .mappings()
            .first()
        )
        if r is None:
            return None
        return SnapshotInfo(
            period=period,
            selection_run_id=r["selection_run_id"],
            selected_at=r["selected_at"],
            eligible_count=r["eligible_count"],
            fingerprint=r["fingerprint"],
            enqueued_at=r["enqueued_at"],
        )

    def _insert_audit(self, conn: Connection, e: AuditEntry) -> None:
        conn.execute(insert(audit_log).values(audit_row(e)))

    def _missing_or_lost(
        self, conn: Connection, keys: Sequence[OperationKey], why: str
    ) -> dict[str, DigestError]:
        """The error for each key that matched no guarded row: unknown key, or a lost race."""
        states: dict[str, str] = {}
        for chunk in chunked([str(k) for k in keys], KEYS):
            q = select(wi.c.operation_key, wi.c.state).where(wi.c.operation_key.in_(chunk))
            states.update((k, state) for k, state in conn.execute(q))
        return {
            str(k): (
                LostRace(f"{k}: {why}; it is {states[str(k)]}")
                if str(k) in states
                else UnknownWorkItem(f"no work item for {k}")
            )
            for k in keys
        }
