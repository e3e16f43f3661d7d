"""Shared fixtures: a hermetic environment, a fixed clock, and the ledger backends.

PostgreSQL comes from `DIGEST_TEST_DATABASE_URL` (set by `make test`). Without it the PostgreSQL
cases skip locally and *fail* under `CI=true`, so a green CI cannot hide an untested tier.
`T0` (Monday 06:00 UTC after 2026-W42) and `W42` are the rigs' (`digest_pipeline.rigs.seeding`);
`DIGEST_FIRST_WEEK` is `FIRST_PERIOD` in the tests and every process they start.
Temporary files go to RAM (`MEMORY_DIR`) when the machine has room there, and Hypothesis runs
the `dev` profile locally and the derandomised `ci` profile under `CI=true`.
"""

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from sqlalchemy import Engine, text

from digest_pipeline.adapters.sql.engine import create_ledger_engine, migrate
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.adapters.sql.schema import metadata
from digest_pipeline.domain.durability import ALLOW_VARIABLE
from digest_pipeline.domain.periods import FIRST_PERIOD
from digest_pipeline.ports import Ledger
from digest_pipeline.rigs.seeding import T0 as T0
from digest_pipeline.rigs.seeding import W42 as W42
from digest_pipeline.rigs.servers.pg_cluster import throwaway_allowance as throwaway_allowance
from digest_pipeline_tests.fakes import FakeLedger, FakeMailer, FixedClock

#: The definitions start their weekly partitions at this week (component/partitions.py), read once,
#: when a test module first imports them: set here, before any does, so the suite's fixed weeks
#: (2026-W42, FIRST_PERIOD) are partitions whatever the ledger holds and whatever the date is.
FIRST_WEEK_VARIABLE = "DIGEST_FIRST_WEEK"
os.environ[FIRST_WEEK_VARIABLE] = str(FIRST_PERIOD)

BACKENDS = ["fake", "sqlite", pytest.param("postgres", marks=pytest.mark.integration)]
SQL_BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.integration)]

#: Linux's RAM-backed folder. Every SQLite commit (each test's ledger, and Dagster's run and
#: event storage in a test's DAGSTER_HOME) fsyncs; on a disk those fsyncs, not the code under
#: test, set the suite's pace (the eight-week life test ran in half the time here). The
#: simulator puts its cell databases there for the same reason (`digest_pipeline.rigs.sim`).
MEMORY_DIR = Path("/dev/shm")
#: Used only with this much free: a run writes about 100 MB, and pytest keeps the last three
#: runs' folders (`tmp_path_retention_count`), so that is a few hundred MB of RAM at most.
MEMORY_DIR_MIN_FREE = 2 * 1024**3


def under_ci() -> bool:
    """`CI=true` (or 1, yes): what `.ci/run` sets."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


# Hypothesis profiles; `pytest --hypothesis-profile NAME` picks the other one.
# Both keep Hypothesis's 100 examples per property: a property costs milliseconds an example
# (the whole unit tier takes seconds), so fewer would save nothing worth the bugs it could miss.
# No deadline and no too_slow health check in either: both measure wall time, which a loaded
# 2-core machine stretches, so they fail tests that are not wrong.
# Both start from Hypothesis's `default`: a profile without a parent would inherit whichever
# profile Hypothesis loaded on import (its own `ci` wherever a `CI` variable is set at all).
#: local runs: a new random draw each run (and Hypothesis's example database in .hypothesis/)
settings.register_profile(
    "dev",
    parent=settings.get_profile("default"),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
#: CI: what Hypothesis's own `ci` profile does (derandomised: the same examples on every run, so
#: a red CI is reproduced locally with `--hypothesis-profile ci`; no example database; the
#: failing example's blob printed), stated here rather than left to its detection of CI variables
settings.register_profile(
    "ci",
    parent=settings.get_profile("default"),
    derandomize=True,
    database=None,
    print_blob=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("ci" if under_ci() else "dev")


def _memory_dir_has_room() -> bool:
    """MEMORY_DIR exists, is writable, is not mounted noexec and has MEMORY_DIR_MIN_FREE free."""
    try:
        return (
            MEMORY_DIR.is_dir()
            and os.access(MEMORY_DIR, os.W_OK | os.X_OK)
            and not os.statvfs(MEMORY_DIR).f_flag & os.ST_NOEXEC
            and shutil.disk_usage(MEMORY_DIR).free >= MEMORY_DIR_MIN_FREE
        )
    except OSError:
        return False


def pytest_configure(config: pytest.Config) -> None:
    """Temporary files in MEMORY_DIR, unless TMPDIR is set or the folder is missing or small.

    TMPDIR moves `tmp_path` (pytest's base folder comes from `tempfile.gettempdir()`), the
    benchmarks' work folders and every child process's temporary files alike. Set `TMPDIR` (to
    /tmp, say) to keep them on disk.
    """
    if "TMPDIR" in os.environ or not _memory_dir_has_room():
        return
    os.environ["TMPDIR"] = str(MEMORY_DIR)
    tempfile.tempdir = None  # gettempdir() caches its answer: look again, now with TMPDIR


#: what scripts/pg-test-cluster.sh says of its cluster (fsync off), and the partitions' first
#: week (above): kept, like the servers' URLs, so the processes a test starts inherit them
KEPT_SETTINGS = frozenset({ALLOW_VARIABLE, FIRST_WEEK_VARIABLE})


def drop_digest_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Removes every `DIGEST_*` setting but the test servers' `DIGEST_TEST_*` URLs.

    The throwaway cluster's `DIGEST_ALLOW_NONDURABLE_LEDGER` stays too: without it every
    delivery on that cluster is refused. A test of the refusal removes it itself. So does
    `DIGEST_FIRST_WEEK`, which the definitions in a process a test starts read.
    """
    for name in list(os.environ):
        if (
            name.startswith("DIGEST_")
            and not name.startswith("DIGEST_TEST_")
            and name not in KEPT_SETTINGS
        ):
            monkeypatch.delenv(name)


def hermetic_environ() -> dict[str, str]:
    """This process's environment as `drop_digest_env` leaves it, for a process a test starts.

    For a module-scoped fixture, which is set up before the autouse fixture below runs.
    """
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("DIGEST_") or k.startswith("DIGEST_TEST_") or k in KEPT_SETTINGS
    }


@pytest.fixture(autouse=True)
def _hermetic_env(monkeypatch: pytest.MonkeyPatch) -> None:
    drop_digest_env(monkeypatch)


@contextmanager
def hermetic_env() -> Iterator[None]:
    """`_hermetic_env` for a session- or module-scoped fixture, which is set up before it."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        drop_digest_env(monkeypatch)
        yield


@pytest.fixture(params=["remote", "local"])
def both_mailer_kinds(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test with FakeMailers that stand for a provider, then for a local call.

    The two take different delivery loops (a remote mailer's sends on a pool, a local one's
    ledger calls on a ledger thread while the next wave is composed), so a module that asks
    for this holds both to its invariants. A mailer built with `remote=` keeps its own.
    """
    monkeypatch.setattr(FakeMailer, "remote_default", request.param == "remote")
    return str(request.param)


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
    if under_ci():
        pytest.fail(f"integration tier cannot run under CI: {reason}")
    pytest.skip(reason)


def require_postgres_url() -> str:
    """The ledger's test database URL (`DIGEST_TEST_DATABASE_URL`)."""
    return require_url("DIGEST_TEST_DATABASE_URL")


def require_redis_url() -> str:
    """The test Redis server's URL (`DIGEST_TEST_REDIS_URL`, from scripts/redis-test-server.sh)."""
    return require_url("DIGEST_TEST_REDIS_URL", "a throwaway Redis")


def require_tool(found: Path | None, tool: str, package: str) -> Path:
    """`found`, an installed tool's path, or skip (locally) / fail (under CI=true) without it.

    `package` names the Debian package scripts/debian-test-tools.sh installs for it.
    """
    if found is not None:
        return found
    reason = f"{tool} is not installed (make test installs Debian's {package} as root)"
    if under_ci():
        pytest.fail(f"integration tier cannot run under CI: {reason}")
    pytest.skip(reason)


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
