"""Lease recovery: expired claims with no open attempt become due again, those with one `unknown`.

Its own module because the sweeper runs it apart from delivery, through the same guarded moves.
"""

from datetime import datetime

from sqlalchemy import and_, exists, select

from digest_pipeline.adapters.sql import rows as sql_rows
from digest_pipeline.adapters.sql.base import wi
from digest_pipeline.adapters.sql.moves import SqlMoves
from digest_pipeline.adapters.sql.schema import attempts
from digest_pipeline.domain.model import LeaseRecovery
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.domain.transitions import after_lease_expiry


class SqlLeaseRecovery(SqlMoves):
    """The recovery of claims whose lease expired."""

    def recover_expired_leases(self, now: datetime) -> LeaseRecovery:
        expired = and_(wi.c.state == DeliveryState.CLAIMED.value, wi.c.lease_expires_at <= now)
        open_attempt = exists().where(
            attempts.c.operation_key == wi.c.operation_key,
            attempts.c.lease_token == wi.c.lease_token,
            attempts.c.finished_at.is_(None),
        )
        with self._engine.begin() as conn:
            # Lock the expired claims first, so no worker can start an attempt on one of them
            # between the check for an open attempt and the move.
            rows = conn.execute(
                select(wi, open_attempt.label("open_attempt"))
                .where(expired)
                .with_for_update(of=wi, skip_locked=True)
            ).mappings()
            moves = [
                after_lease_expiry(sql_rows.work_item(r), r["open_attempt"], now) for r in rows
            ]
            if not moves:
                return LeaseRecovery((), ())
            # Locked rows cannot lose their guard; a lost one would be a bug, so it raises.
            if lost := self._apply_many(conn, moves):
                raise next(iter(lost.values()))
        return LeaseRecovery(
            tuple(sorted((t.key for t in moves if t.target is not DeliveryState.UNKNOWN), key=str)),
            tuple(sorted((t.key for t in moves if t.target is DeliveryState.UNKNOWN), key=str)),
        )
