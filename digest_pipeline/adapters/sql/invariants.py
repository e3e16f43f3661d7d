"""Design §4's invariants as SQL over one period, for the asset checks, the CLI and the harness.

The unique keys and compare-and-set updates are the guards; these queries are the detectors
that prove the guards held. Each returns the offending operation keys.
"""

from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Select,
    and_,
    case,
    exists,
    func,
    literal,
    literal_column,
    not_,
    or_,
    select,
    text,
)

from digest_pipeline.adapters.sql.schema import (
    attempts,
    audit_log,
    cleanups,
    eligibility_snapshot,
    period_runs,
    work_items,
)
from digest_pipeline.domain.model import (
    INVARIANTS,
    InvariantResult,
    fingerprint_share,
    format_fingerprint,
)
from digest_pipeline.domain.periods import DEFAULT_INSTANCE, Period
from digest_pipeline.domain.possible_sends import (
    NOT_DELIVERED_REASONS,
    REPLAY_ACTIONS,
    REPLAY_NOT_FOUND_SUFFIX,
)
from digest_pipeline.domain.states import DeliveryState

wi, a = work_items, attempts
SAMPLE = 10
#: audit actions that count as evidence an `unknown` outcome was looked at
RECONCILING_ACTIONS = ("reconcile", "resolve")


def key_in(column: ColumnElement[str], keys: Select[Any], pg: bool) -> ColumnElement[bool]:
    """`column IN (keys)`; on PostgreSQL `column = ANY(ARRAY(keys))`, the keys read once.

    Given `IN (SELECT …)`, or a join on the key, PostgreSQL's planner hashes the keys and scans
    the whole of `column`'s table for them. `attempts` grows by a week's attempts every week, so
    that cost grows with the history. An array of keys it can only look up in the key's index,
    at the cost of this week's rows alone.
    """
    if pg:
        return column == func.any(func.array(keys.scalar_subquery()))
    return column.in_(keys)


def period_keys(p: str) -> Select[Any]:
    """The operation keys of period `p`'s work items."""
    return select(wi.c.operation_key).where(wi.c.period == p)


def _attempts_in_period(p: str, pg: bool) -> tuple[ColumnElement[bool], ...]:
    """`attempts` joined with `work_items`, narrowed to period `p` (`key_in` on PostgreSQL)."""
    if pg:
        return wi.c.period == p, key_in(a.c.operation_key, period_keys(p), pg)
    return (wi.c.period == p,)


def _result(conn: Connection, name: str, keys: Select[Any]) -> InvariantResult:
    found: list[str] = sorted(set(conn.execute(keys).scalars()))
    return InvariantResult(name, not found, len(found), tuple(found[:SAMPLE]))


def _at_most_one_cleanup_per_key(p: str) -> Select[Any]:
    c = cleanups
    twice = (
        select(c.c.operation_key)
        .where(c.c.period == p)
        .group_by(c.c.operation_key)
        .having(func.count() > 1)
    )
    # A cleanup is early when the item was never sent, was marked sent only after it, or had
    # an attempt (a send) start after it.
    sent_after = exists().where(
        a.c.operation_key == c.c.operation_key, a.c.started_at > c.c.claimed_at
    )
    early = (
        select(c.c.operation_key)
        .join(wi, wi.c.operation_key == c.c.operation_key)
        .where(
            c.c.period == p,
            or_(wi.c.sent_at.is_(None), wi.c.sent_at > c.c.claimed_at, sent_after),
        )
    )
    return select(twice.union(early).subquery().c[0])


def _no_silent_timeout(p: str, pg: bool) -> Select[Any]:
    still_open_elsewhere = and_(
        a.c.finished_at.is_(None),
        not_(and_(wi.c.state == DeliveryState.CLAIMED.value, wi.c.lease_token == a.c.lease_token)),
    )
    looked_at = exists().where(
        audit_log.c.operation_key == a.c.operation_key,
        audit_log.c.action.in_(RECONCILING_ACTIONS),
        audit_log.c.at >= a.c.started_at,
    )
    return (
        select(a.c.operation_key)
        .join(wi, wi.c.operation_key == a.c.operation_key)
        .where(
            *_attempts_in_period(p, pg),
            or_(a.c.outcome == "unknown", still_open_elsewhere),
            wi.c.state != DeliveryState.UNKNOWN.value,
            not_(looked_at),
        )
    )


def _every_customer_has_visible_state(
    p: str, now: datetime, enqueued: bool, instance: str
) -> Select[Any]:
    stuck = select(wi.c.operation_key).where(
        wi.c.period == p,
        or_(
            and_(wi.c.state == DeliveryState.CLAIMED.value, wi.c.lease_expires_at <= now),
            and_(wi.c.state == DeliveryState.RETRY_SCHEDULED.value, wi.c.next_attempt_at.is_(None)),
        ),
    )
    if not enqueued:
        return stuck
    es = eligibility_snapshot
    missing = (
        select((literal(f"{instance}:{p}:") + es.c.customer_id).label("operation_key"))
        .outerjoin(wi, and_(wi.c.period == es.c.period, wi.c.customer_id == es.c.customer_id))
        .where(es.c.period == p, wi.c.operation_key.is_(None))
    )
    return select(stuck.union(missing).subquery().c[0])


def _no_duplicate_send(p: str, pg: bool) -> Select[Any]:
    """Keys whose history may hold more than one delivery (`domain.possible_sends`'s rule)."""
    au = audit_log
    delivered = and_(a.c.outcome == "sent", a.c.duplicate.is_(False))
    in_flight = and_(wi.c.state == DeliveryState.CLAIMED.value, wi.c.lease_token == a.c.lease_token)
    open_elsewhere = and_(a.c.outcome.is_(None), a.c.finished_at.is_(None), not_(in_flight))
    # later evidence that nothing had been delivered: a lookup that found nothing (at a
    # reconciliation or a replay), or an operator's "not sent"
    cleared = exists().where(
        au.c.operation_key == a.c.operation_key,
        au.c.at >= a.c.started_at,
        or_(
            and_(au.c.action == "reconcile", au.c.reason.in_(NOT_DELIVERED_REASONS)),
            and_(
                au.c.action == "resolve",
                func.coalesce(au.c.to_state, "") != DeliveryState.SENT.value,
            ),
            and_(
                au.c.action == "replay",
                au.c.reason.endswith(REPLAY_NOT_FOUND_SUFFIX, autoescape=True),
            ),
        ),
    )
    uncertain = and_(or_(a.c.outcome == "unknown", open_elsewhere), not_(cleared))
    # the attempt's span: how many replays reopened the key before it started
    span = (
        select(func.count())
        .where(
            au.c.operation_key == a.c.operation_key,
            au.c.action.in_(REPLAY_ACTIONS),
            au.c.at <= a.c.started_at,
        )
        .scalar_subquery()
    )
    # only keys with two attempts or more that may have delivered can hold two deliveries
    candidates = (
        select(a.c.operation_key)
        .join(wi, wi.c.operation_key == a.c.operation_key)
        .where(
            *_attempts_in_period(p, pg),
            or_(a.c.outcome.in_(["sent", "unknown"]), a.c.outcome.is_(None)),
        )
        .group_by(a.c.operation_key)
        .having(func.count() > 1)
    )
    tries = (
        select(
            a.c.operation_key.label("key"),
            span.label("span"),
            func.coalesce(a.c.mailer, "").label("mailer"),
            case((delivered, 1), else_=0).label("delivered"),
            case((uncertain, 1), else_=0).label("uncertain"),
        )
        .join(wi, wi.c.operation_key == a.c.operation_key)
        .where(key_in(a.c.operation_key, candidates, pg))
        .subquery()
    )
    spans = (
        select(
            tries.c.key,
            func.sum(tries.c.delivered).label("delivered"),
            func.max(tries.c.uncertain).label("uncertain"),
        )
        .group_by(tries.c.key, tries.c.span, tries.c.mailer)
        .subquery()
    )
    # per span and mailer: its confirmed sends, or one when it holds only unsettled uncertain
    # attempts (two mailers deduplicate nothing between them)
    sends = case((spans.c.delivered > 0, spans.c.delivered), else_=spans.c.uncertain)
    return select(spans.c.key).group_by(spans.c.key).having(func.sum(sends) > 1)


@dataclass(frozen=True)
class Seal:
    """A PostgreSQL snapshot this process fingerprinted whole: its header and its rows' writer.

    The freeze writes every row of a period's snapshot in one transaction. A row version is
    never changed in place: an UPDATE writes a new version stamped (`xmin`) with the updating
    transaction's id, an INSERT a new row with its own, a DELETE lowers the count. So while the
    period holds exactly `eligible_count` rows, every one written by `writer`, the rows are the
    ones that were fingerprinted. (A transaction id comes round again only after 2**32 later
    transactions, and only an edit by the one transaction that gets this very id could pass.)
    """

    fingerprint: str
    eligible_count: int
    #: the transaction id (`xmin`, as text) every row of the period was written by
    writer: str


def _snapshot_unchanged(
    conn: Connection, period: Period, seals: dict[str, Seal] | None = None
) -> InvariantResult:
    """Invariant 5: the period's snapshot still matches the fingerprint taken at its freeze.

    With `seals` (PostgreSQL only), a period this process fingerprinted before is confirmed by
    one count of its rows and their writer (`Seal`) instead of reading and hashing every row:
    every delivery batch step asks, and at 1,000,000 customers a full pass takes seconds.
    """
    p = str(period)
    header = conn.execute(select(period_runs).where(period_runs.c.period == p)).mappings().first()
    if header is None:
        return InvariantResult("snapshot_unchanged", True, 0)
    es = eligibility_snapshot
    expected = (header["fingerprint"], header["eligible_count"])
    seal = seals.get(p) if seals is not None else None
    if seal is not None and (seal.fingerprint, seal.eligible_count) == expected:
        written_by = text("xmin = CAST(:writer AS xid)").bindparams(writer=seal.writer)
        held, sealed = conn.execute(
            select(func.count(), func.count().filter(written_by)).where(es.c.period == p)
        ).one()
        if held == sealed == seal.eligible_count:
            return InvariantResult("snapshot_unchanged", True, 0)
    columns: list[ColumnElement[Any]] = [es.c.customer_id, es.c.recipient]
    if seals is not None:
        columns.append(literal_column("xmin::text"))
    total, count = 0, 0
    writers: set[str] = set()
    rows = conn.execution_options(yield_per=10_000).execute(
        select(*columns).where(es.c.period == p)
    )
    # the SQLite ledger checks it every batch step, over every row of the period: no entry
    # object per row
    for customer_id, recipient, *writer in rows:
        total += fingerprint_share(customer_id, recipient)
        count += 1
        writers.update(writer)
    same = (format_fingerprint(total), count) == expected
    if seals is not None:
        # rows rewritten with the same values still match, but by more than one writer: every
        # later check of the period then reads them all again
        if same and len(writers) == 1:
            seals[p] = Seal(*expected, writers.pop())
        else:
            seals.pop(p, None)
    return InvariantResult("snapshot_unchanged", same, 0 if same else 1, () if same else (p,))


def evaluate_invariants(
    conn: Connection,
    period: Period,
    now: datetime,
    names: Collection[str] | None = None,
    seals: dict[str, Seal] | None = None,
    instance: str = DEFAULT_INSTANCE,
) -> list[InvariantResult]:
    """Design §4's invariants, in `INVARIANTS` order, for one period (or only `names`).

    `seals` is the ledger's record of PostgreSQL snapshots it fingerprinted whole (`Seal`);
    `instance` names the keys of frozen customers that have no work item.
    """
    p = str(period)
    pg = conn.dialect.name == "postgresql"
    wanted = INVARIANTS if names is None else [n for n in INVARIANTS if n in names]

    def enqueued() -> bool:
        q = select(period_runs.c.enqueued_at).where(period_runs.c.period == p)
        return conn.execute(q).scalar_one_or_none() is not None

    checks: dict[str, Callable[[], InvariantResult]] = {
        "at_most_one_cleanup_per_key": lambda: _result(
            conn, "at_most_one_cleanup_per_key", _at_most_one_cleanup_per_key(p)
        ),
        "no_silent_timeout": lambda: _result(conn, "no_silent_timeout", _no_silent_timeout(p, pg)),
        "every_customer_has_visible_state": lambda: _result(
            conn,
            "every_customer_has_visible_state",
            _every_customer_has_visible_state(p, now, enqueued(), instance),
        ),
        "no_duplicate_send": lambda: _result(conn, "no_duplicate_send", _no_duplicate_send(p, pg)),
        "snapshot_unchanged": lambda: _snapshot_unchanged(conn, period, seals),
    }
    return [checks[name]() for name in wanted]
