"""The `digest` command over a shop source in another database: seeding refused, runs that read it.

`digest seed` writes the demo shop into the ledger database, which a configured source does not
read, so it refuses in one line with nothing written. `digest run` reads the shop's own tables
(integer-keyed customers here) and delivers to them; with a mapping the database cannot serve,
the run stops at its first step with the mapping's one line, and nothing is frozen.
"""

from pathlib import Path

import pytest
from sqlalchemy import create_engine, func, select

from digest_pipeline.adapters.sql.customer_source import SqlCustomerSource
from digest_pipeline.adapters.sql.engine import create_ledger_engine
from digest_pipeline.adapters.sql.schema import period_runs, work_items
from digest_pipeline_tests.adapters.shop_schema import copy_demo, members_config
from digest_pipeline_tests.cli.conftest import digest


@pytest.fixture
def shop(env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A seeded demo ledger, its shop copied into `shop.db`, and the variables that read it."""
    assert digest(env, "seed", "--customers", "20", "--seed", "5")[0] == 0
    ledger = create_ledger_engine(env["DIGEST_DATABASE_URL"])
    shop_db = create_engine(f"sqlite:///{tmp_path / 'shop.db'}")
    copy_demo(SqlCustomerSource(ledger), shop_db, None)
    ledger.dispose()
    shop_db.dispose()
    (tmp_path / "shop.yaml").write_text(members_config(None), encoding="utf-8")
    source = {
        "DIGEST_SOURCE_DATABASE_URL": f"sqlite:///{tmp_path / 'shop.db'}",
        "DIGEST_SOURCE_CONFIG": str(tmp_path / "shop.yaml"),
    }
    # the run's resources read the process environment, as under `dagster dev`
    for name, value in source.items():
        monkeypatch.setenv(name, value)
    return {**env, **source}


def _ledger_counts(url: str) -> tuple[int, int]:
    engine = create_ledger_engine(url, create=False)
    with engine.connect() as conn:
        counts = (
            conn.execute(select(func.count()).select_from(period_runs)).scalar_one(),
            conn.execute(select(func.count()).select_from(work_items)).scalar_one(),
        )
    engine.dispose()
    return counts


def test_seeding_with_a_source_set_is_one_line_and_writes_nothing(env, tmp_path):
    (tmp_path / "shop.yaml").write_text("customers: {table: users}\n", encoding="utf-8")

    code, out, err = digest(
        {**env, "DIGEST_SOURCE_CONFIG": str(tmp_path / "shop.yaml")}, "seed", "--customers", "5"
    )

    assert code == 2
    assert out == ""
    assert err == (
        "digest seed: error: DIGEST_SOURCE_CONFIG set: digest seed writes the demo shop into the "
        "ledger database, which the configured source does not read; unset them to seed the demo\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shop.yaml"]


def test_a_run_reads_the_shops_own_tables_and_delivers_to_its_customers(shop, tmp_path):
    code, out, err = digest(shop, "run", "--period", "latest")

    assert code == 0, out + err
    status = digest(shop, "status", "--period", "latest", "--json")
    assert status[0] == 0, status[2]
    sent = sorted((tmp_path / "outbox" / "new").iterdir())
    assert sent
    # the shop's integer ids, not the demo's `customer-…` ones, name every operation key
    customers = {p.name.rsplit("_", 1)[1].removesuffix(".eml") for p in sent}
    assert all(c.isdigit() for c in customers), customers
    periods, items = _ledger_counts(shop["DIGEST_DATABASE_URL"])
    assert periods == 1
    assert items > 0


def test_a_run_whose_mapping_the_database_cannot_serve_freezes_nothing(shop, tmp_path):
    broken = members_config(None).replace("email: mail", "email: e_mail")
    (tmp_path / "shop.yaml").write_text(broken, encoding="utf-8")

    code, out, err = digest(shop, "run", "--period", "latest")

    # refused before the run starts, as `digest status` refuses it
    assert (code, out) == (2, ""), out + err
    assert err == (
        f"digest run: error: DIGEST_SOURCE_CONFIG={tmp_path / 'shop.yaml'}: customers (table "
        "members): no column e_mail (for email)\n"
    )
    assert _ledger_counts(shop["DIGEST_DATABASE_URL"]) == (0, 0)


def test_status_refuses_a_mapping_the_database_cannot_serve_in_one_line(shop, tmp_path):
    broken = members_config(None).replace("table: member_orders", "table: orders_2026")
    (tmp_path / "shop.yaml").write_text(broken, encoding="utf-8")

    code, out, err = digest(shop, "status", "--period", "latest")

    assert (code, out) == (2, "")
    assert err == (
        f"digest status: error: DIGEST_SOURCE_CONFIG={tmp_path / 'shop.yaml'}: "
        "orders (table orders_2026): no such table in the source database\n"
    )
