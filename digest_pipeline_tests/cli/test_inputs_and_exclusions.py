"""Small CLI rules: integer arguments in ASCII digits only, and `digest status` naming the
eligible customers the snapshot leaves out (counts for invalid ids; ids for long addresses)."""

import json
from datetime import UTC, datetime

import pytest
from sqlalchemy import create_engine, insert

from digest_pipeline.adapters.sql.schema import customers
from digest_pipeline_tests.cli.conftest import digest

LONG = "a" * 64 + "@" + "b" * 300  # 365 characters


#: a full-width 3 and an Arabic-Indic 3 (int() takes both), and spellings periods refuse
SPELLINGS = ["\uff13", "\u0663", "1_0", " 3", "3.0", "+3"]


@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize("flag", ["--customers", "--seed"])
def test_seed_refuses_an_integer_not_in_ascii_digits(env, flag, spelling):
    argv = ["seed", "--customers", "3", flag, spelling]
    code, out, err = digest(env, *argv)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert "not a whole number in ASCII digits" in err


def test_replay_refuses_a_full_width_max_keys(env):
    argv = ["replay", "--period", "latest", "--key", "digest:2026-W42:c-1", "--reason", "r"]
    code, _, err = digest(env, *argv, "--max-keys", "\uff11\uff10\uff10")
    assert code == 2
    assert "not a whole number in ASCII digits" in err


def test_status_shows_the_customers_the_snapshot_left_out(env):
    assert digest(env, "seed", "--customers", "5")[0] == 0
    engine = create_engine(env["DIGEST_DATABASE_URL"])
    at = datetime(2026, 1, 1, tzinfo=UTC)
    with engine.begin() as conn:
        conn.execute(
            insert(customers),
            [
                {
                    "customer_id": cid,
                    "email": email,
                    "active": True,
                    "opted_in": True,
                    "created_at": at,
                }
                for cid, email in [
                    ("bad id\x1b[2J", "x@example.com"),
                    ("bad/id", "y@example.com"),
                    ("zz-long-1", LONG),
                ]
            ],
        )
    engine.dispose()
    assert digest(env, "seed", "--customers", "5", "--period", "latest")[0] == 0

    code, out, _ = digest(env, "status", "--period", "latest")
    assert code == 0
    assert "left out (source now): 2 invalid customer ids, 1 addresses over 320 characters" in out
    assert "(zz-long-1)" in out
    assert "bad" not in out
    assert "\x1b" not in out
    assert "@" not in out

    code, out, _ = digest(env, "status", "--period", "latest", "--json")
    metrics = json.loads(out)["metrics"]
    assert (metrics["left_out_invalid_ids"], metrics["left_out_long_addresses"]) == (2, 1)
    assert metrics["left_out_long_address_ids"] == ["zz-long-1"]
