"""The snapshot check on the SQL ledgers: any edit of a frozen row is found, on both backends,
whatever bytes the rows hold and however the edit keeps the row count; rows written again as
they were still match. On PostgreSQL every check after a ledger's first is answered by counting
the rows' writer (`invariants.Seal`), so each edit comes after a check that passed."""

import pytest
from sqlalchemy import text

from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.domain.model import SnapshotEntry
from digest_pipeline_tests.conftest import T0, W42
from digest_pipeline_tests.contract.ledger_steps import W43

ENTRIES = [
    SnapshotEntry("customer-1", "ada@example.test"),
    SnapshotEntry("customer-2", "zoë.núñez@exämple.test"),  # bytes beyond ASCII
    SnapshotEntry("customer-3", "not an address"),  # frozen as read; the send fails it later
    SnapshotEntry("customer-4", "x" * 300 + "@example.test"),
    *(SnapshotEntry(f"customer-{n:04d}", f"c{n}@example.test") for n in range(5, 400)),
]


def _unchanged(ledger: SqlLedger) -> bool:
    [result] = ledger.check_invariants(W42, T0, names={"snapshot_unchanged"})
    return result.passed


@pytest.fixture
def frozen_ledger(sql_ledger):
    sql_ledger.freeze_snapshot(W42, "run-1", T0, ENTRIES)
    sql_ledger.freeze_snapshot(W43, "run-2", T0, ENTRIES[:3])  # another week's rows never count
    return sql_ledger


@pytest.mark.parametrize(
    "edit",
    [
        "UPDATE eligibility_snapshot SET recipient = 'eve@example.test' "
        "WHERE period = '2026-W42' AND customer_id = 'customer-2'",
        "DELETE FROM eligibility_snapshot WHERE period = '2026-W42' AND customer_id = 'customer-0007'",
        "INSERT INTO eligibility_snapshot (period, customer_id, recipient) "
        "VALUES ('2026-W42', 'customer-9999', 'mallory@example.test')",
        # a key changed in place: the row count stays the same
        "UPDATE eligibility_snapshot SET customer_id = customer_id || 'x' "
        "WHERE period = '2026-W42' AND customer_id = 'customer-0010'",
    ],
)
def test_an_edited_snapshot_is_refused(frozen_ledger, edit):
    assert _unchanged(frozen_ledger)

    with frozen_ledger.engine.begin() as conn:
        conn.execute(text(edit))

    assert not _unchanged(frozen_ledger)


def _edit(ledger: SqlLedger, statement: str) -> None:
    with ledger.engine.begin() as conn:
        conn.execute(text(statement))


def test_rows_rewritten_with_the_same_values_still_match_and_a_later_edit_is_refused(
    frozen_ledger,
):
    assert _unchanged(frozen_ledger)
    _edit(frozen_ledger, "UPDATE eligibility_snapshot SET recipient = recipient")
    assert _unchanged(frozen_ledger)

    _edit(
        frozen_ledger,
        "UPDATE eligibility_snapshot SET recipient = 'eve@example.test' "
        "WHERE period = '2026-W42' AND customer_id = 'customer-0100'",
    )
    assert not _unchanged(frozen_ledger)


def test_an_edited_fingerprint_is_refused(frozen_ledger):
    assert _unchanged(frozen_ledger)
    _edit(
        frozen_ledger,
        f"UPDATE period_runs SET fingerprint = '{'0' * 64}' WHERE period = '2026-W42'",
    )
    assert not _unchanged(frozen_ledger)


def test_a_row_deleted_and_written_again_as_it_was_still_matches(frozen_ledger):
    assert _unchanged(frozen_ledger)
    _edit(
        frozen_ledger,
        "DELETE FROM eligibility_snapshot WHERE period = '2026-W42' AND customer_id = 'customer-2'",
    )
    assert not _unchanged(frozen_ledger)
    _edit(
        frozen_ledger,
        "INSERT INTO eligibility_snapshot (period, customer_id, recipient) "
        "VALUES ('2026-W42', 'customer-2', 'zoë.núñez@exämple.test')",
    )
    assert _unchanged(frozen_ledger)


@pytest.mark.integration
def test_an_edit_by_a_transaction_older_than_the_check_is_refused(sql_engine_factory):
    # PostgreSQL's ledger confirms a period it fingerprinted before by its rows' writer
    # (`invariants.Seal`); a transaction that took its id before that check still writes rows
    # of its own, which the next check must see
    frozen_ledger = SqlLedger(sql_engine_factory("postgres"))
    frozen_ledger.freeze_snapshot(W42, "run-1", T0, ENTRIES)
    with frozen_ledger.engine.connect() as older:
        older.execute(text("SELECT pg_current_xact_id()"))
        assert _unchanged(frozen_ledger)
        older.execute(
            text(
                "UPDATE eligibility_snapshot SET recipient = 'eve@example.test' "
                "WHERE period = '2026-W42' AND customer_id = 'customer-0200'"
            )
        )
        older.commit()
    assert not _unchanged(frozen_ledger)
