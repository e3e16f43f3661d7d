"""The operator commands' world: a real ledger (SQLite and PostgreSQL) after a real delivery run.

`mixed` delivers 2026-W42 to ten customers through the outbox with injected failures, so every
state an operator meets is there; the `digest` command then runs against the same database URL
and Maildir, with the same fixed clock. `dump` reads every table, for "nothing changed".
On SQLite, `mixed` is delivered once per session and each test gets a copy of the result
(`mixed_sqlite_template`; `test_mixed_template.py` holds the copy to a fresh delivery).
"""

import io
import json
import shutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select

from digest_pipeline.adapters.mail.outbox import OutboxMailer
from digest_pipeline.adapters.sql.engine import create_ledger_engine
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.adapters.sql.schema import metadata
from digest_pipeline.cli import context, main
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import Message
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.retry import RetryPolicy
from digest_pipeline.ports import Clock, Composer, Mailer
from digest_pipeline.services.wave import DeliveryReport
from digest_pipeline_tests.builders import (
    SHOP_LINK_SETTINGS,
    deliver_all,
    key_of,
    make_deliverer,
    seed_period,
)
from digest_pipeline_tests.conftest import SQL_BACKENDS, T0, hermetic_env, throwaway_allowance
from digest_pipeline_tests.fakes import FaultInjectingMailer, FixedClock, WrappingMailer

PROJECT = Path(__file__).resolve().parents[2]
PERMANENT = SendOutcome.failed(FailureClass.PERMANENT, "smtp:550")
TRANSIENT = SendOutcome.failed(FailureClass.TRANSIENT, "smtp:421")
#: two attempts per item, so two transient failures dead-letter it (`max_attempts`)
POLICY = DeliveryPolicy(retry=RetryPolicy(max_attempts=2))

#: the customers of `mixed` and what its delivery run leaves them in
CUSTOMERS = 10
SENT = (1, 8, 9, 10)
FAILED = (2, 3)  # permanent: `failed` with a dead-letter row (reason `permanent`)
DEAD = (4, 5)  # transient twice: `dead_lettered` (reason `max_attempts`)
UNKNOWN = (6, 7)  # accepted by the outbox, then the worker saw a timeout


def dump(engine: Engine) -> dict[str, list[tuple[object, ...]]]:
    """Every row of every ledger table, in primary-key order."""
    with engine.connect() as conn:
        return {
            t.name: [tuple(r) for r in conn.execute(select(t).order_by(*t.primary_key.columns))]
            for t in metadata.sorted_tables
        }


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        assert self.code == 0, self.err
        return json.loads(self.out)


@dataclass
class Cli:
    """`digest …` through `main()`, with the world's env and clock; keeps every output."""

    env: dict[str, str]
    clock: Clock
    transcript: list[str] = field(default_factory=list)

    def __call__(self, *argv: str, env: dict[str, str] | None = None) -> Run:
        out, err = io.StringIO(), io.StringIO()
        code = main(
            list(argv),
            env={**self.env, **(env or {})},
            root=PROJECT,
            out=out,
            err=err,
            clock=self.clock,
        )
        self.transcript += [out.getvalue(), err.getvalue()]
        return Run(code, out.getvalue(), err.getvalue())


class ScriptedMailer(WrappingMailer):
    """Wraps a real mailer: a scripted outcome is returned *instead of* sending (the provider
    never sees it), and `outage` fails every send while set; otherwise the inner mailer sends."""

    def __init__(self, inner: Mailer) -> None:
        super().__init__(inner)
        self._lock = threading.Lock()
        self._scripts: dict[str, list[SendOutcome]] = {}
        self.outage: SendOutcome | None = None

    def script(self, key: OperationKey, *outcomes: SendOutcome) -> None:
        with self._lock:
            self._scripts.setdefault(str(key), []).extend(outcomes)

    def send(self, message: Message, *, idempotency_key: str) -> SendOutcome:
        with self._lock:
            queue = self._scripts.get(idempotency_key)
            scripted = queue.pop(0) if queue else self.outage
        if scripted is not None:
            return scripted
        return self._inner.send(message, idempotency_key=idempotency_key)


@dataclass
class World:
    """One ledger database and one Maildir, shared by the test's services and its `digest`."""

    engine: Engine
    clock: FixedClock
    outbox_dir: Path
    cli: Cli

    @property
    def ledger(self) -> SqlLedger:
        return SqlLedger(self.engine)

    def dump(self) -> dict[str, list[tuple[object, ...]]]:
        return dump(self.engine)

    def outbox_files(self) -> list[str]:
        return [p.name for p in OutboxMailer(self.outbox_dir).stored()]

    def deliver(
        self, mailer: Mailer, *, policy: DeliveryPolicy = POLICY, composer: Composer | None = None
    ) -> DeliveryReport:
        """One worker pass over everything due now (what a run's delivery step does)."""
        deliverer = make_deliverer(
            self.ledger, mailer, self.clock, policy=policy, composer=composer
        )
        return deliver_all(deliverer)


@pytest.fixture(params=SQL_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    backend: str = request.param
    return backend


#: the unsubscribe secret of the operator world's shop
PRIVATE_SECRET = "a-private-secret-for-cli-tests"
#: the OS user the operator world's commands run as; `--operator alice` is then no claim
OS_USER = "alice"
#: the real `os_user`, for the tests about where the OS user comes from
REAL_OS_USER = context.os_user


@pytest.fixture
def world(
    backend: str,
    sql_engine_factory: Callable[[str], Engine],
    clock: FixedClock,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> World:
    """An empty, migrated ledger; `digest` pointed at it and at an outbox Maildir.

    The commands run as OS user `alice` (claims of other names are refused unless granted:
    `test_operator_identity.py`), so audit rows read `alice` on any machine.
    """
    return make_world(sql_engine_factory(backend), clock, tmp_path / "outbox", monkeypatch)


def make_world(
    engine: Engine, clock: FixedClock, outbox_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> World:
    """`digest` pointed at `engine` and `outbox_dir`, run as OS user `alice`, on `clock`."""
    monkeypatch.setattr(context, "os_user", lambda: OS_USER)
    env = {
        "DIGEST_DATABASE_URL": engine.url.render_as_string(hide_password=False),
        "DIGEST_MAILER": "outbox",
        "DIGEST_OUTBOX_DIR": str(outbox_dir),
        "DIGEST_CONCURRENCY": "2",
        # a real shop's ledger (no `digest seed` marker): the public demo secret is refused,
        # and so are the demo's loopback link and a missing postal address
        "DIGEST_UNSUBSCRIBE_SECRET": PRIVATE_SECRET,
        **SHOP_LINK_SETTINGS,
        # the test cluster runs with fsync off; `test_nondurable_ledger.py` blanks this
        **throwaway_allowance(),
    }
    return World(engine, clock, outbox_dir, Cli(env, clock))


def populate_mixed(world: World) -> None:
    """2026-W42 for CUSTOMERS customers, delivered into the outbox with injected failures."""
    seed_period(world.ledger, CUSTOMERS, now=world.clock.now())
    faults = FaultInjectingMailer(OutboxMailer(world.outbox_dir))
    mailer = ScriptedMailer(faults)
    for n in FAILED:
        mailer.script(key_of(n), PERMANENT)
    for n in DEAD:
        mailer.script(key_of(n), TRANSIENT, TRANSIENT)
    for n in UNKNOWN:
        faults.timeout_after_accept(key_of(n))
    world.deliver(mailer)
    world.clock.advance(timedelta(minutes=1))  # past the first retry's backoff
    world.deliver(mailer)


@dataclass(frozen=True)
class MixedTemplate:
    """`populate_mixed`'s result on SQLite, to be copied: the ledger file, the Maildir, the time."""

    ledger: Path
    outbox_dir: Path
    now: datetime


@pytest.fixture(scope="session")
def mixed_sqlite_template(
    sqlite_template: Path, tmp_path_factory: pytest.TempPathFactory
) -> MixedTemplate:
    """`populate_mixed` once per session (two delivery passes; some 80 tests start from it)."""
    folder = tmp_path_factory.mktemp("mixed-template")
    path = folder / "ledger.db"
    shutil.copy(sqlite_template, path)
    engine = create_ledger_engine(f"sqlite:///{path}")
    clock = FixedClock(T0)
    try:
        with hermetic_env():
            populate_mixed(World(engine, clock, folder / "outbox", Cli({}, clock)))
    finally:
        engine.dispose()
    # the last connection closed, SQLite checkpointed its WAL into the file: one file to copy
    assert not path.with_name(f"{path.name}-wal").exists()
    return MixedTemplate(path, folder / "outbox", clock.now())


@pytest.fixture
def mixed(
    request: pytest.FixtureRequest,
    backend: str,
    clock: FixedClock,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[World]:
    """The world after `populate_mixed`: sent, failed, dead-lettered and unknown items.

    On SQLite a copy of `mixed_sqlite_template`, with `clock` set to its time; on PostgreSQL
    (truncated per test) `populate_mixed` runs again.
    """
    if backend != "sqlite":
        world: World = request.getfixturevalue("world")
        populate_mixed(world)
        yield world
        return
    template: MixedTemplate = request.getfixturevalue("mixed_sqlite_template")
    path = tmp_path / "ledger.db"
    shutil.copy(template.ledger, path)
    shutil.copytree(template.outbox_dir, tmp_path / "outbox")
    clock.set(template.now)
    engine = create_ledger_engine(f"sqlite:///{path}")
    yield make_world(engine, clock, tmp_path / "outbox", monkeypatch)
    engine.dispose()


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A private ledger, outbox and Dagster home; the job's resources read os.environ too."""
    values = {
        "DIGEST_DATABASE_URL": f"sqlite:///{tmp_path / 'digest.db'}",
        "DIGEST_OUTBOX_DIR": str(tmp_path / "outbox"),
        "DAGSTER_HOME": str(tmp_path / "dagster_home"),
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


def digest(env: dict[str, str], *argv: str) -> tuple[int, str, str]:
    """`digest ARGV` through `main()` from the project folder: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), env=env, root=PROJECT, out=out, err=err)
    return code, out.getvalue(), err.getvalue()
