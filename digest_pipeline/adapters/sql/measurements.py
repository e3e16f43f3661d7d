"""What the rigs measure beyond the `ReadModel` port: counts the simulator, chaos and benchmarks read.

They are the SQL ledger's own (the fake keeps its records in memory and the tests read those), so
no benchmark or harness writes SQL against the ledger's tables itself.
"""

from dataclasses import dataclass

from sqlalchemy import case, func, select

from digest_pipeline.adapters.sql.base import SqlBase, wi
from digest_pipeline.adapters.sql.schema import attempts, audit_log, cleanups
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.states import DeliveryState


@dataclass(frozen=True)
class AttemptTally:
    """A period's attempts, counted per key and in total."""

    #: keys with more than one `sent` attempt
    keys_sent_twice: int
    #: keys with more than one attempt of any outcome
    keys_attempted_twice: int
    #: attempts never closed (their worker died mid-send)
    open_attempts: int


class SqlMeasurements(SqlBase):
    """Counts for the rigs, read in one statement each."""

    def attempt_tally(self, period: Period) -> AttemptTally:
        in_period = wi.c.period == str(period)
        per_key = (
            select(
                attempts.c.operation_key,
                func.count().label("n"),
                func.sum(case((attempts.c.outcome == "sent", 1), else_=0)).label("sent"),
                func.sum(case((attempts.c.finished_at.is_(None), 1), else_=0)).label("open"),
            )
            .join(wi, wi.c.operation_key == attempts.c.operation_key)
            .where(in_period)
            .group_by(attempts.c.operation_key)
            .subquery()
        )
        with self.engine.connect() as conn:
            sent_twice, attempted_twice, open_ = conn.execute(
                select(
                    func.coalesce(func.sum(case((per_key.c.sent > 1, 1), else_=0)), 0),
                    func.coalesce(func.sum(case((per_key.c.n > 1, 1), else_=0)), 0),
                    func.coalesce(func.sum(per_key.c.open), 0),
                )
            ).one()
        return AttemptTally(int(sent_twice), int(attempted_twice), int(open_))

    def attempts_with_detail(self, period: Period, detail: str) -> int:
        """The period's attempts closed with exactly this detail (a provider's reply code)."""
        q = (
            select(func.count())
            .select_from(attempts.join(wi, wi.c.operation_key == attempts.c.operation_key))
            .where(wi.c.period == str(period), attempts.c.detail == detail)
        )
        with self.engine.connect() as conn:
            return int(conn.execute(q).scalar_one())

    def keys_ever_unknown(self, period: Period) -> int:
        """Keys that are `unknown` now or were moved out of `unknown` (by the audit trail)."""
        p, unknown = str(period), DeliveryState.UNKNOWN.value
        was_unknown = (
            select(audit_log.c.operation_key)
            .where(audit_log.c.period == p, audit_log.c.from_state == unknown)
            .union(select(wi.c.operation_key).where(wi.c.period == p, wi.c.state == unknown))
            .subquery()
        )
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(was_unknown)).scalar_one())

    def cleanup_rows_per_key(self, period: Period) -> dict[str, int]:
        """Cleanup rows by operation key (the unique row means one each, or none)."""
        q = (
            select(cleanups.c.operation_key, func.count())
            .where(cleanups.c.period == str(period))
            .group_by(cleanups.c.operation_key)
        )
        with self.engine.connect() as conn:
            return {str(key): int(n) for key, n in conn.execute(q)}

    def sent_by_worker(self, owner_prefix: str) -> dict[str, int]:
        """`sent` attempts per worker whose owner name starts with `owner_prefix`."""
        q = (
            select(attempts.c.worker, func.count())
            .where(attempts.c.outcome == "sent", attempts.c.worker.startswith(owner_prefix))
            .group_by(attempts.c.worker)
        )
        with self.engine.connect() as conn:
            return {str(w): int(n) for w, n in conn.execute(q)}
