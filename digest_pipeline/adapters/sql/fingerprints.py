"""The `SecretFingerprints` port in SQL: one `secret_fingerprints` row per purpose.

The first use inserts with `ON CONFLICT DO NOTHING` and reads the row back, so concurrent first
uses agree on one fingerprint. A rotation is a compare-and-set on the current fingerprint, and
its audit row goes into `audit_log` in the same transaction: a rotation is never unaudited.
"""

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite

from digest_pipeline.adapters.sql.base import audit_row
from digest_pipeline.adapters.sql.schema import audit_log, secret_fingerprints
from digest_pipeline.domain.fingerprints import FingerprintRecord
from digest_pipeline.domain.model import AuditEntry
from digest_pipeline.ports import SecretFingerprints

sf = secret_fingerprints


def _row(r: FingerprintRecord) -> dict[str, Any]:
    return {
        "purpose": r.purpose,
        "fingerprint": r.current,
        "recorded_at": r.recorded_at,
        "previous_fingerprint": r.previous,
        "previous_until": r.previous_until,
    }


def _read(conn: Connection, purpose: str) -> FingerprintRecord | None:
    r = conn.execute(select(sf).where(sf.c.purpose == purpose)).mappings().first()
    if r is None:
        return None
    return FingerprintRecord(
        purpose=r["purpose"],
        current=r["fingerprint"],
        recorded_at=r["recorded_at"],
        previous=r["previous_fingerprint"],
        previous_until=r["previous_until"],
    )


class SqlSecretFingerprints(SecretFingerprints):
    """The fingerprints kept in the ledger database at `engine`."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._dialect = postgresql if engine.dialect.name == "postgresql" else sqlite

    def fingerprint_record(self, purpose: str) -> FingerprintRecord | None:
        with self._engine.connect() as conn:
            return _read(conn, purpose)

    def record_first_fingerprint(
        self, purpose: str, fingerprint: str, at: datetime
    ) -> FingerprintRecord:
        with self._engine.begin() as conn:
            found = _read(conn, purpose)
            if found is not None:
                return found
            first = FingerprintRecord(purpose, fingerprint, at)
            conn.execute(self._dialect.insert(sf).values(_row(first)).on_conflict_do_nothing())
            made = _read(conn, purpose)
        if made is None:  # pragma: no cover - the row was inserted or already there
            raise RuntimeError(f"no {purpose} fingerprint after recording one")
        return made

    def rotate_fingerprint(
        self, after: FingerprintRecord, expected: str | None, audit: AuditEntry
    ) -> bool:
        with self._engine.begin() as conn:
            if expected is None:
                stmt = self._dialect.insert(sf).values(_row(after)).on_conflict_do_nothing()
                # RETURNING, not rowcount: psycopg reports -1 for INSERT … ON CONFLICT DO NOTHING
                done = conn.execute(stmt.returning(sf.c.purpose)).first() is not None
            else:
                guarded = update(sf).where(
                    sf.c.purpose == after.purpose, sf.c.fingerprint == expected
                )
                done = conn.execute(guarded.values(_row(after))).rowcount == 1
            if not done:
                return False
            conn.execute(insert(audit_log).values(audit_row(audit)))
        return True
