"""The generated digest rows: written in bulk, read per wave, replaced only for never-sent keys."""

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from sqlalchemy import (
    Text,
    cast,
    exists,
    literal,
    select,
)

from digest_pipeline.adapters.sql.base import CHUNK, KEYS, SqlBase, wi
from digest_pipeline.adapters.sql.bulk import insert_rows
from digest_pipeline.adapters.sql.clauses import locked_items, one_of
from digest_pipeline.adapters.sql.schema import (
    digest_rows,
    eligibility_snapshot,
)
from digest_pipeline.domain.chunks import chunked
from digest_pipeline.domain.model import (
    DigestRow,
)
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.regeneration import REGENERABLE, RowReplacement
from digest_pipeline.domain.states import DELIVERED, DeliveryState
from digest_pipeline.ports import ContentStore


class SqlContent(SqlBase, ContentStore):
    """The `ContentStore` role of `SqlLedger`."""

    def add_digest_rows(self, rows: Iterable[DigestRow]) -> int:
        written = 0
        values = (
            {
                "operation_key": str(r.key),
                "period": str(r.key.period),
                "customer_id": r.key.customer_id,
                "position": r.position,
                "payload": r.payload,
            }
            for r in rows
        )
        with self._engine.begin() as conn:
            for chunk in chunked(values, CHUNK):
                insert_rows(conn, digest_rows, chunk)
                written += len(chunk)
        # delivery reads these rows by key next, a wave at a time
        self._refresh_statistics([digest_rows], written)
        return written

    def digest_rows_of(self, keys: Sequence[OperationKey]) -> dict[OperationKey, list[DigestRow]]:
        by_name: dict[str, tuple[OperationKey, list[DigestRow]]] = {str(k): (k, []) for k in keys}
        dr = digest_rows
        # Read as text and decoded once per distinct text: the rows of one product carry the
        # same payload, so a wave decodes a few hundred payloads, not four a customer. Rows
        # are read, never changed, so sharing the decoded object is safe.
        decoded: dict[str, Any] = {}
        with self._engine.connect() as conn:
            for chunk in chunked(by_name, KEYS):
                q = (
                    select(dr.c.operation_key, dr.c.position, cast(dr.c.payload, Text))
                    .where(one_of(dr.c.operation_key, chunk, self._pg))
                    .order_by(dr.c.operation_key, dr.c.position, dr.c.row_id)
                )
                for name, position, text in conn.execute(q).all():
                    payload = decoded.get(text)
                    if payload is None:
                        payload = decoded[text] = json.loads(text)
                    key, found = by_name[name]
                    found.append(DigestRow(key, position, payload))
        return dict(by_name.values())

    def keys_with_rows_of(self, keys: Sequence[OperationKey]) -> set[OperationKey]:
        by_name = {str(k): k for k in keys}
        found: set[OperationKey] = set()
        dr = digest_rows
        with self._engine.connect() as conn:
            for chunk in chunked(by_name, KEYS):
                q = (
                    select(dr.c.operation_key)
                    .where(one_of(dr.c.operation_key, chunk, self._pg))
                    .distinct()
                )
                found.update(by_name[name] for name in conn.execute(q).scalars())
        return found

    def iter_needing_content(self, period: Period, page: int = 5_000) -> Iterator[str]:
        es, dr = eligibility_snapshot, digest_rows
        p = str(period)
        # the anti-joins run in the database: no key list goes out and none comes back
        has_rows = exists().where(
            dr.c.operation_key == literal(self._key_prefix(period)) + es.c.customer_id
        )
        delivered = exists().where(
            wi.c.period == es.c.period,
            wi.c.customer_id == es.c.customer_id,
            wi.c.state.in_([s.value for s in DELIVERED]),
        )
        q = select(es.c.customer_id).where(es.c.period == p, ~has_rows, ~delivered)
        yield from self._pages(q, es.c.customer_id, lambda r: r["customer_id"], page)

    def keys_with_rows(self, period: Period) -> set[OperationKey]:
        q = (
            select(digest_rows.c.operation_key)
            .where(digest_rows.c.period == str(period))
            .distinct()
        )
        with self._engine.connect() as conn:
            return {OperationKey.parse(k) for k in conn.execute(q).scalars()}

    def replace_digest_rows(
        self, keys: Sequence[OperationKey], rows: Iterable[DigestRow]
    ) -> RowReplacement:
        wanted = {str(k): k for k in keys}
        new = list(rows)
        strays = sorted({str(r.key) for r in new} - wanted.keys())
        if strays:
            raise ValueError(f"rows of keys not being replaced: {', '.join(strays[:3])}")
        never_sent = [s.value for s in REGENERABLE]
        dr = digest_rows
        replaced: set[str] = set()
        refused: dict[OperationKey, DeliveryState | None] = {}
        removed = written = 0
        with self._engine.begin() as conn:
            # chunks in key order too, so the whole transaction locks in `locked_items`' order
            for chunk in chunked(sorted(wanted), KEYS):
                # Locked until commit (PostgreSQL; SQLite's BEGIN IMMEDIATE serialises writers),
                # so no worker claims an item between this read and the rows' replacement.
                q = locked_items(chunk, self._pg, wi.c.operation_key, wi.c.state)
                states: dict[str, str] = {k: s for k, s in conn.execute(q)}
                movable = [k for k in chunk if states.get(k) in never_sent]
                refused.update(
                    (wanted[k], DeliveryState(states[k]) if k in states else None)
                    for k in chunk
                    if states.get(k) not in never_sent
                )
                if not movable:
                    continue
                # the state guard again in the statement itself: the compare-and-set on state
                guard = exists().where(
                    wi.c.operation_key == dr.c.operation_key, wi.c.state.in_(never_sent)
                )
                deleted = conn.execute(dr.delete().where(dr.c.operation_key.in_(movable), guard))
                removed += deleted.rowcount
                replaced.update(movable)
            values = [
                {
                    "operation_key": str(r.key),
                    "period": str(r.key.period),
                    "customer_id": r.key.customer_id,
                    "position": r.position,
                    "payload": r.payload,
                }
                for r in new
                if str(r.key) in replaced
            ]
            for part in chunked(values, CHUNK):
                insert_rows(conn, dr, part)
                written += len(part)
        return RowReplacement(frozenset(wanted[k] for k in replaced), refused, removed, written)
