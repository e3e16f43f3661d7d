"""The ledger's PostgreSQL sessions never JIT-compile, whichever driver the URL names.

JIT compilation cost more than the statements it compiled (the double-send invariant: 830 ms of
LLVM for 80 ms of work at 100,000 items), so `create_ledger_engine` turns it off per session.
"""

import os

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from digest_pipeline.adapters.sql.engine import create_ledger_engine

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_a_ledger_session_has_jit_off_on_either_driver(pg_engine, driver: str) -> None:
    url = make_url(os.environ["DIGEST_TEST_DATABASE_URL"]).set(drivername=f"postgresql+{driver}")
    engine = create_ledger_engine(url.render_as_string(hide_password=False))
    try:
        with engine.connect() as conn:
            # the server's own default is on: only the ledger's hook turns it off
            assert conn.execute(text("SHOW jit")).scalar_one() == "off"
            assert (
                conn.execute(
                    text("SELECT reset_val FROM pg_settings WHERE name = 'jit'")
                ).scalar_one()
                == "on"
            )
    finally:
        engine.dispose()
