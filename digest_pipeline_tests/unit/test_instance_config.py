from pathlib import Path

import dagster as dg
import pytest
import yaml

from digest_pipeline.instance import prepare_home, storage_block
from digest_pipeline.settings import InvalidSetting

PROJECT = Path(__file__).resolve().parents[2]


def test_the_embedded_default_is_dagsters_own_sqlite_storage_in_the_home(tmp_path):
    home = prepare_home(PROJECT, {}, tmp_path / "home")
    config = yaml.safe_load((home / "dagster.yaml").read_text(encoding="utf-8"))
    assert "storage" not in config
    assert config["telemetry"] == {"enabled": False}
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        assert instance.is_persistent
        assert type(instance.run_storage).__name__ == "SqliteRunStorage"
    finally:
        instance.dispose()


def pooled(config: dict[str, object]) -> dict[str, object]:
    """dagster-postgres's storage with pooled connections, configured with `config`."""
    return {
        "custom": {
            "module": "digest_pipeline.dagster_storage",
            "class": "PooledPostgresStorage",
            "config": config,
        }
    }


def test_a_postgres_url_moves_storage_to_dagster_postgres():
    assert storage_block({"DAGSTER_PG_URL": "postgresql+psycopg2://u@h/db"}) == pooled(
        {"postgres_url": {"env": "DAGSTER_PG_URL"}}
    )


def test_a_postgres_url_without_the_psycopg2_driver_is_refused_in_one_line():
    with pytest.raises(InvalidSetting, match="must name the psycopg2 driver") as e:
        storage_block({"DAGSTER_PG_URL": "postgresql://u@h/db"})
    assert "\n" not in str(e.value)


def test_postgres_fields_name_only_the_variables_that_are_set():
    block = storage_block({"DAGSTER_PG_HOST": "db", "DAGSTER_PG_PASSWORD": "pw"})
    assert block == pooled(
        {
            "postgres_db": {
                "password": {"env": "DAGSTER_PG_PASSWORD"},
                "hostname": {"env": "DAGSTER_PG_HOST"},
                "db_name": "dagster",
                "username": "postgres",
                "scheme": "postgresql+psycopg2",
            }
        }
    )
