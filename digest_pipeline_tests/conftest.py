"""Shared fixtures: a hermetic environment, a fixed clock, and the ledger backends.

PostgreSQL comes from `DIGEST_TEST_DATABASE_URL` (set by `make test`). Without it the PostgreSQL
cases skip locally and *fail* under `CI=true`, so a green CI cannot hide an untested tier.
`T0` (Monday 06:00 UTC after 2026-W42) and `W42` are the rigs' (`digest_pipeline.rigs.seeding`).
"""

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from digest_pipeline.adapters.sql.engine import create_ledger_engine, migrate
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.adapters.sql.schema import metadata
from digest_pipeline.ports import Ledger
from digest_pipeline.rigs.seeding import T0 as T0
from digest_pipeline.rigs.seeding import W42 as W42
from digest_pipeline_tests.fakes import FakeLedger, FixedClock

BACKENDS = ["fake", "sqlite", pytest.param("postgres", marks=pytest.mark.integration)]
SQL_BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.integration)]


@pytest.fixture(autouse=True)
def _hermetic_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("DIGEST_") and not name.startswith("DIGEST_TEST_"):
            monkeypatch.delenv(name)


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(T0)


def require_url(variable: str, service: str = "a throwaway PostgreSQL") -> str:
    """A test server's URL from `variable`, or skip (locally) / fail (under CI=true) without.

    `service` names what `make test` starts for it, for the skip/fail reason.
    """
    url = os.environ.get(variable)
    if url:
        return url
    reason = f"{variable} is not set (make test starts {service})"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"integration tier cannot run under CI: {reason}")
    pytest.skip(reason)


def require_postgres_url() -> str:
    """The ledger's test database URL (`DIGEST_TEST_DATABASE_URL`)."""
    return require_url("DIGEST_TEST_DATABASE_URL")


def require_redis_url() -> str:
    """The test Redis server's URL (`DIGEST_TEST_REDIS_URL`, from scripts/redis-test-server.sh)."""
    return require_url("DIGEST_TEST_REDIS_URL", "a throwaway Redis")


@pytest.fixture(scope="session")
def pg_engine() -> Iterator[Engine]:
    engine = create_ledger_engine(require_postgres_url(), pool_size=20)
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    migrate(engine)
    yield engine
    engine.dispose()


def truncate_pg(engine: Engine) -> None:
    names = ", ".join(t.name for t in metadata.sorted_tables)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sqlite-template") / "ledger.db"
    engine = create_ledger_engine(f"sqlite:///{path}")
    migrate(engine)
    engine.dispose()
    return path


@pytest.fixture
def sql_engine_factory(
    request: pytest.FixtureRequest, sqlite_template: Path, tmp_path: Path
) -> Iterator[Callable[[str], Engine]]:
    """Makes a migrated, empty engine of a backend: a copied SQLite file or truncated PG."""
    made: list[Engine] = []

    def make(backend: str) -> Engine:
        if backend == "sqlite":
            path = tmp_path / f"ledger-{len(made)}.db"
            shutil.copy(sqlite_template, path)
            lite = create_ledger_engine(f"sqlite:///{path}")
            made.append(lite)
            return lite
        engine: Engine = request.getfixturevalue("pg_engine")
        truncate_pg(engine)
        return engine

    yield make
    for engine in made:
        engine.dispose()


@pytest.fixture(params=BACKENDS)
def ledger(request: pytest.FixtureRequest, sql_engine_factory: Callable[[str], Engine]) -> Ledger:
    """The same ledger contract over the fake, SQLite and PostgreSQL."""
    if request.param == "fake":
        return FakeLedger()
    return SqlLedger(sql_engine_factory(request.param))


@pytest.fixture(params=SQL_BACKENDS)
def sql_ledger(
    request: pytest.FixtureRequest, sql_engine_factory: Callable[[str], Engine]
) -> SqlLedger:
    return SqlLedger(sql_engine_factory(request.param))
