"""What each ledger database reports about keeping commits through a crash, on its own connection.

A SQLite ledger runs `synchronous=FULL` on every connection, whatever the build's default, and
reports nothing to refuse. The suite's PostgreSQL (scripts/pg-test-cluster.sh) runs with
`fsync` and `synchronous_commit` off, and says so.
"""

import pytest
from sqlalchemy import text

from digest_pipeline.adapters.sql.durability import read_durability
from digest_pipeline.domain.durability import unsafe_settings

#: SQLite's number for `synchronous=FULL`
FULL = 2


def test_a_sqlite_ledger_syncs_every_commit_and_reports_nothing_to_refuse(sql_engine_factory):
    engine = sql_engine_factory("sqlite")
    with engine.connect() as conn:
        assert conn.execute(text("PRAGMA synchronous")).scalar_one() == FULL
    assert read_durability(engine) == {}


@pytest.mark.integration
def test_the_test_clusters_postgresql_reports_that_it_can_lose_commits(sql_engine_factory):
    reported = read_durability(sql_engine_factory("postgres"))
    assert unsafe_settings(reported) == ["fsync=off", "synchronous_commit=off"]
