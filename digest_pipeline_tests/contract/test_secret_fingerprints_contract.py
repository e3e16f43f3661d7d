"""The secret fingerprint store's contract, over the fake, SQLite and PostgreSQL ledgers.

The first fingerprint recorded for a purpose stays until a rotation replaces it; concurrent first
uses agree on one; a rotation is a compare-and-set on the current fingerprint whose audit row is
written with it, or, when it loses, neither is.
"""

import threading
from datetime import timedelta

from digest_pipeline.domain.fingerprints import (
    ROTATE_ACTION,
    UNSUBSCRIBE,
    FingerprintRecord,
    fingerprint,
    rotation_audit,
)
from digest_pipeline.ports import Ledger

A, B, C = (fingerprint(f"secret-{n}-of-sixteen-bytes") for n in "abc")


def test_the_first_fingerprint_recorded_stays_and_is_the_only_one(ledger: Ledger, clock):
    store = ledger.secret_fingerprints
    assert store.fingerprint_record(UNSUBSCRIBE) is None

    first = store.record_first_fingerprint(UNSUBSCRIBE, A, clock.now())
    clock.advance(timedelta(minutes=1))
    second = store.record_first_fingerprint(UNSUBSCRIBE, B, clock.now())

    assert first == second == FingerprintRecord(UNSUBSCRIBE, A, first.recorded_at)
    assert first.recorded_at == clock.now() - timedelta(minutes=1)
    assert store.fingerprint_record(UNSUBSCRIBE) == first
    assert ledger.audit_log() == []


def test_concurrent_first_uses_agree_on_one_fingerprint(ledger: Ledger, clock):
    store = ledger.secret_fingerprints
    fingerprints = [fingerprint(f"secret-{n:02d}-of-sixteen-bytes") for n in range(6)]
    start = threading.Barrier(len(fingerprints))
    seen: list[str] = []

    def first_use(fp: str) -> None:
        start.wait()
        seen.append(store.record_first_fingerprint(UNSUBSCRIBE, fp, clock.now()).current)

    threads = [threading.Thread(target=first_use, args=(fp,)) for fp in fingerprints]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    recorded = store.fingerprint_record(UNSUBSCRIBE)
    assert recorded is not None
    assert recorded.current in fingerprints
    assert seen == [recorded.current] * len(fingerprints)


def test_a_rotation_replaces_the_current_fingerprint_with_its_audit_row(ledger: Ledger, clock):
    store = ledger.secret_fingerprints
    before = store.record_first_fingerprint(UNSUBSCRIBE, A, clock.now())
    clock.advance(timedelta(hours=1))
    until = clock.now() + timedelta(weeks=8)
    after = FingerprintRecord(UNSUBSCRIBE, B, clock.now(), previous=A, previous_until=until)

    assert store.rotate_fingerprint(after, A, rotation_audit(before, after, "alice", "leaked"))

    assert store.fingerprint_record(UNSUBSCRIBE) == after
    (row,) = ledger.audit_log()
    assert (row.action, row.actor, row.at, row.key) == (ROTATE_ACTION, "alice", clock.now(), None)
    assert row.reason.startswith("leaked [")
    assert A[:12] in row.reason
    assert B[:12] in row.reason
    assert A not in row.reason
    assert B not in row.reason


def test_a_rotation_from_a_stale_fingerprint_writes_nothing(ledger: Ledger, clock):
    store = ledger.secret_fingerprints
    current = store.record_first_fingerprint(UNSUBSCRIBE, A, clock.now())
    stale = FingerprintRecord(UNSUBSCRIBE, C, clock.now())

    # another process rotated A -> B first, or assumed no record existed
    assert not store.rotate_fingerprint(stale, B, rotation_audit(None, stale, "bob", "race"))
    assert not store.rotate_fingerprint(stale, None, rotation_audit(None, stale, "bob", "race"))

    assert store.fingerprint_record(UNSUBSCRIBE) == current
    assert ledger.audit_log() == []


def test_a_rotation_may_make_the_first_record(ledger: Ledger, clock):
    store = ledger.secret_fingerprints
    until = clock.now() + timedelta(weeks=1)
    first = FingerprintRecord(UNSUBSCRIBE, B, clock.now(), previous=A, previous_until=until)

    assert store.rotate_fingerprint(first, None, rotation_audit(None, first, "alice", "upgrade"))

    assert store.fingerprint_record(UNSUBSCRIBE) == first
    assert store.record_first_fingerprint(UNSUBSCRIBE, C, clock.now()) == first
    assert [e.action for e in ledger.audit_log()] == [ROTATE_ACTION]
