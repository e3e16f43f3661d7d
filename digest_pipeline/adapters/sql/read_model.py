"""The read model (status, checks, metrics, rigs) and the audit trail, with the invariants beside it."""

from collections.abc import Collection, Iterable, Iterator, Sequence
from datetime import datetime

from sqlalchemy import (
    Float,
    column,
    distinct,
    func,
    select,
    text,
)

from digest_pipeline.adapters.sql import rows as sql_rows
from digest_pipeline.adapters.sql.base import KEYS, SqlBase, wi
from digest_pipeline.adapters.sql.clauses import period_items
from digest_pipeline.adapters.sql.invariants import evaluate_invariants, key_in, period_keys
from digest_pipeline.adapters.sql.schema import (
    attempts,
    audit_log,
    cleanups,
    dead_letters,
    provider_events,
    sql_literals,
    suppressions,
)
from digest_pipeline.adapters.sql.types import UtcDateTime
from digest_pipeline.domain.chunks import chunked
from digest_pipeline.domain.feedback import (
    EventType,
    FeedbackCounts,
    SuppressionReason,
    unsubscribe_window,
)
from digest_pipeline.domain.model import (
    Attempt,
    AuditEntry,
    DeadLetterRecord,
    InvariantResult,
    ItemLease,
    ItemTimes,
    WorkItem,
)
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.states import TERMINAL, DeliveryState
from digest_pipeline.domain.timing import WAITING, ItemTimeSummary
from digest_pipeline.ports import (
    AuditTrail,
    ReadModel,
)


def _nearest_rank(n: str, q: int, least: str = "LEAST", greatest: str = "GREATEST") -> str:
    """`domain.timing.percentile_rank` in SQL, for `n` values: the same integers."""
    return f"{least}({n}, {greatest}(1, ({n} * {q} + 99) / 100))"


def _pg_seconds(interval: str) -> str:
    # EXTRACT gives exact numeric seconds; one rounding to float8, as timedelta.total_seconds()
    return f"EXTRACT(EPOCH FROM {interval})::float8"


def _pg_pick(sorted_intervals: str, q: int) -> str:
    n = f"cardinality({sorted_intervals})::bigint"
    return _pg_seconds(f"{sorted_intervals}[{_nearest_rank(n, q)}]")


def _sqlite_microseconds(col: str) -> str:
    # SQLite stores `YYYY-MM-DD HH:MM:SS.ffffff`: whole seconds from strftime, then the six
    # digits, so the difference is exact integer microseconds, as Python's timedelta is
    return f"(CAST(strftime('%s', {col}) AS INTEGER) * 1000000 + CAST(substr({col}, 21, 6) AS INTEGER))"


def _sqlite_seconds(later: str, earlier: str) -> str:
    # one division of exact integers, correctly rounded as `timedelta.total_seconds()` is
    return f"({_sqlite_microseconds(later)} - {_sqlite_microseconds(earlier)}) / 1000000.0"


_WAITING_SQL = sql_literals(sorted(WAITING))
_ITEM_TIME_COLUMNS = (
    column("claim_p50", Float),
    column("claim_p95", Float),
    column("oldest", UtcDateTime),
    column("lag_p50", Float),
    column("lag_max", Float),
)
#: `ReadModel.item_time_summary` in one statement: the database sorts a period's delays instead
#: of this process converting every item's four times, twice a run; a contract test holds both
#: statements to the Python reference.
#: PostgreSQL: one scan; the intervals sort as they are, in one aggregate each, and only the
#: picked ones become seconds (every row's EXTRACT to numeric, ranked in materialised windows,
#: costs several times as much).
_ITEM_TIME_SUMMARY_ON_PG = text(
    f"""
SELECT {_pg_pick("claims", 50)}, {_pg_pick("claims", 95)}, oldest,
       {_pg_pick("lags", 50)}, {_pg_seconds("lag_max")}
FROM (
    SELECT array_agg(claim ORDER BY claim) FILTER (WHERE claim IS NOT NULL) AS claims,
           array_agg(lag ORDER BY lag) FILTER (WHERE lag IS NOT NULL) AS lags,
           min(created_at) FILTER (WHERE state IN ({_WAITING_SQL})) AS oldest,
           max(lag) AS lag_max
    FROM (
        SELECT first_claimed_at - created_at AS claim, cleaned_at - sent_at AS lag,
               state, created_at
        FROM work_items WHERE period = :period
    ) AS times
) AS sorted
"""
).columns(*_ITEM_TIME_COLUMNS)
#: SQLite: no arrays, so window ranks over seconds taken from the stored text; its two-argument
#: min() and max() are LEAST and GREATEST
_ITEM_TIME_SUMMARY_ON_SQLITE = text(
    f"""
WITH times AS (
    SELECT {_sqlite_seconds("first_claimed_at", "created_at")} AS claim,
           {_sqlite_seconds("cleaned_at", "sent_at")} AS lag,
           state, created_at
    FROM work_items WHERE period = :period
),
claims AS (
    SELECT claim, row_number() OVER (ORDER BY claim) AS i, count(*) OVER () AS n
    FROM times WHERE claim IS NOT NULL
),
lags AS (
    SELECT lag, row_number() OVER (ORDER BY lag) AS i, count(*) OVER () AS n
    FROM times WHERE lag IS NOT NULL
)
SELECT
    (SELECT claim FROM claims WHERE i = {_nearest_rank("n", 50, "min", "max")}),
    (SELECT claim FROM claims WHERE i = {_nearest_rank("n", 95, "min", "max")}),
    (SELECT min(created_at) FROM times WHERE state IN ({_WAITING_SQL})),
    (SELECT lag FROM lags WHERE i = {_nearest_rank("n", 50, "min", "max")}),
    (SELECT max(lag) FROM times)
"""
).columns(*_ITEM_TIME_COLUMNS)


class SqlReadModel(SqlBase, ReadModel, AuditTrail):
    """The `ReadModel` and `AuditTrail` roles of `SqlLedger`."""

    def get(self, key: OperationKey) -> WorkItem | None:
        return self.items_of([key]).get(key)

    def items_of(self, keys: Sequence[OperationKey]) -> dict[OperationKey, WorkItem]:
        found: dict[OperationKey, WorkItem] = {}
        with self._engine.connect() as conn:
            for chunk in chunked({str(k) for k in keys}, KEYS):
                q = select(wi).where(wi.c.operation_key.in_(chunk))
                for r in conn.execute(q).mappings():
                    item = sql_rows.work_item(r)
                    found[item.key] = item
        return found

    def items(
        self, period: Period, states: Iterable[DeliveryState] | None = None
    ) -> list[WorkItem]:
        with self._engine.connect() as conn:
            rows = conn.execute(period_items(period, states)).mappings()
            items = [sql_rows.work_item(r) for r in rows]
        return sorted(items, key=lambda i: str(i.key))

    # A period's items are paged by customer id: within one period a key is its customer id
    # behind the period's own prefix, so that is key order, read off the unique index on
    # (period, customer_id). Paged by key, the first page of each new week would walk the key
    # index past every earlier week's items, a cost that grows with the ledger's history.
    def iter_items(
        self, period: Period, states: Iterable[DeliveryState] | None = None, page: int = 1_000
    ) -> Iterator[WorkItem]:
        yield from self._pages(
            period_items(period, states), wi.c.customer_id, sql_rows.work_item, page
        )

    def iter_item_times(self, period: Period) -> Iterator[ItemTimes]:
        c = wi.c
        q = select(
            c.customer_id, c.state, c.created_at, c.first_claimed_at, c.sent_at, c.cleaned_at
        ).where(c.period == str(period))
        yield from self._pages(q, wi.c.customer_id, sql_rows.item_times, 5_000)

    def item_time_summary(self, period: Period) -> ItemTimeSummary:
        q = _ITEM_TIME_SUMMARY_ON_PG if self._pg else _ITEM_TIME_SUMMARY_ON_SQLITE
        with self._engine.connect() as conn:
            row = conn.execute(q, {"period": str(period)}).one()
        return ItemTimeSummary(*row)

    def iter_item_leases(self, period: Period, page: int = 1_000) -> Iterator[ItemLease]:
        c = wi.c
        q = select(c.operation_key, c.period, c.customer_id, c.state, c.lease_token).where(
            c.period == str(period)
        )
        yield from self._pages(q, wi.c.customer_id, sql_rows.item_lease, page)

    def attempts(self, key: OperationKey) -> list[Attempt]:
        q = (
            select(attempts)
            .where(attempts.c.operation_key == str(key))
            .order_by(attempts.c.attempt_id)
        )
        with self._engine.connect() as conn:
            return [sql_rows.attempt(r) for r in conn.execute(q).mappings()]

    def state_counts(self, period: Period) -> dict[DeliveryState, int]:
        q = select(wi.c.state, func.count()).where(wi.c.period == str(period)).group_by(wi.c.state)
        with self._engine.connect() as conn:
            return {DeliveryState(state): n for state, n in conn.execute(q)}

    def attempt_outcome_counts(self, period: Period) -> dict[str, int]:
        a = attempts
        of_period = key_in(a.c.operation_key, period_keys(str(period)), self._pg)
        outcome = func.coalesce(a.c.outcome, "open")
        by_outcome = select(outcome, func.count()).where(of_period).group_by(outcome)
        dupes = select(func.count()).where(of_period, a.c.duplicate.is_(True))
        with self._engine.connect() as conn:
            counts: dict[str, int] = {k: n for k, n in conn.execute(by_outcome)}
            if n_dupes := conn.execute(dupes).scalar_one():
                counts["duplicate"] = n_dupes
        return counts

    def open_periods(self) -> list[Period]:
        q = select(wi.c.period).where(wi.c.state.not_in([s.value for s in TERMINAL])).distinct()
        with self._engine.connect() as conn:
            return sorted(Period.parse(p) for p in conn.execute(q).scalars())

    def dead_letters(self, period: Period) -> list[DeadLetterRecord]:
        q = (
            select(dead_letters)
            .where(dead_letters.c.period == str(period))
            .order_by(dead_letters.c.dead_letter_id)
        )
        with self._engine.connect() as conn:
            return [sql_rows.dead_letter(r) for r in conn.execute(q).mappings()]

    def record_audit(self, entry: AuditEntry) -> None:
        with self._engine.begin() as conn:
            self._insert_audit(conn, entry)

    def feedback_counts(self, period: Period) -> FeedbackCounts:
        start, end = unsubscribe_window(period)
        sp, pe = suppressions, provider_events
        unsubscribes = (
            select(func.count())
            .select_from(sp)
            .where(
                sp.c.reason == SuppressionReason.UNSUBSCRIBED.value,
                sp.c.created_at >= start,
                sp.c.created_at < end,
            )
        )
        # this instance's keys only (an endpoint also records other instances' events, unmatched);
        # escaped, as an instance's name may hold LIKE's wildcard `_`
        events = (
            select(pe.c.type, func.count(distinct(pe.c.operation_key)))
            .where(
                pe.c.operation_key.startswith(self._key_prefix(period), autoescape=True),
                pe.c.type.in_([EventType.HARD_BOUNCE.value, EventType.COMPLAINT.value]),
            )
            .group_by(pe.c.type)
        )
        with self._engine.connect() as conn:
            unsubscribed = conn.execute(unsubscribes).scalar_one()
            by_type: dict[str, int] = {t: n for t, n in conn.execute(events)}
        return FeedbackCounts(
            unsubscribes=unsubscribed,
            hard_bounces=by_type.get(EventType.HARD_BOUNCE.value, 0),
            complaints=by_type.get(EventType.COMPLAINT.value, 0),
        )

    def audit_log(self, period: Period | None = None) -> list[AuditEntry]:
        q = select(audit_log).order_by(audit_log.c.audit_id)
        if period is not None:
            q = q.where(audit_log.c.period == str(period))
        with self._engine.connect() as conn:
            return [sql_rows.audit_entry(r) for r in conn.execute(q).mappings()]

    def check_invariants(
        self, period: Period, now: datetime, names: Collection[str] | None = None
    ) -> list[InvariantResult]:
        # right after a delivery or cleanup run the planner still thinks `attempts` and
        # `cleanups` are empty: it joined every attempt to its item by index and sorted them on
        # disk to find double sends, and scanned the cleanups once for each of them
        self._refresh_statistics([attempts, cleanups])
        with self._engine.connect() as conn:
            return evaluate_invariants(conn, period, now, names, self._seals, self._instance)
