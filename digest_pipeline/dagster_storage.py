"""Dagster's PostgreSQL storage with pooled connections: one held per process and store.

dagster-postgres opens a new connection for every event it stores and every run it reads or
updates (a `NullPool`), so a run on PostgreSQL storage would pay a connection set-up, and the
server a backend process, for each of its event rows. The event log and run storage here keep
one connection each (more only while threads use them at once) and check it is alive before
each use; a connection made before a `fork` is never used by the child.
"""

import os
from typing import Any, TypeVar

from dagster_postgres import DagsterPostgresStorage, PostgresEventLogStorage, PostgresRunStorage
from dagster_postgres.utils import (
    create_pg_engine,
    get_token_provider_from_config,
    pg_url_from_config,
)
from sqlalchemy import event, exc
from sqlalchemy.engine import Engine
from sqlalchemy.pool import ConnectionPoolEntry

from digest_pipeline.dagster_private import ConfigurableClassData

S = TypeVar("S", bound="_Configured")
#: connections kept per process; threads writing at once get more, closed when given back
KEPT = 1
OVERFLOW = 10
#: seconds before a kept connection is replaced, as dagster-webserver's own pool does
RECYCLE_S = 3600


def _pooled_engine(url: str, token_provider: Any) -> Engine:
    engine = create_pg_engine(
        url,
        token_provider,
        isolation_level="AUTOCOMMIT",
        pool_size=KEPT,
        max_overflow=OVERFLOW,
        pool_recycle=RECYCLE_S,
        # one round trip per checkout instead of dagster-postgres's new connection; it turns a
        # server restart between two events into a fresh connection, not a failed event write
        pool_pre_ping=True,
    )
    # SQLAlchemy's recipe for pools and os.fork: a connection belongs to the process that made
    # it, and a forked child (a Celery prefork worker) makes its own.
    event.listen(engine, "connect", _remember_pid)
    event.listen(engine, "checkout", _refuse_other_pid)
    return engine


def _remember_pid(_: Any, record: ConnectionPoolEntry) -> None:
    record.info["pid"] = os.getpid()


def _refuse_other_pid(_: Any, record: Any, proxy: Any) -> None:
    # `Any`: the pool's own record and proxy, whose connection attributes the interfaces hide
    if record.info.get("pid") != os.getpid():
        # dropped without a close: the socket is still the parent's
        record.dbapi_connection = proxy.dbapi_connection = None
        raise exc.DisconnectionError("connection made by another process")


class _Configured:
    """A storage made from `storage: postgres:`'s config, as dagster-postgres's classes are."""

    def __init__(
        self,
        postgres_url: str,
        should_autocreate_tables: bool = True,
        inst_data: ConfigurableClassData | None = None,
        token_provider: Any = None,
    ) -> None:
        # the next class in the MRO is the dagster-postgres storage this one is mixed into
        super().__init__(  # type: ignore[call-arg]
            postgres_url, should_autocreate_tables, inst_data, token_provider
        )
        self._pool(postgres_url, should_autocreate_tables, token_provider)

    def _pool(self, postgres_url: str, should_autocreate_tables: bool, token_provider: Any) -> None:
        """Replaces what the dagster-postgres storage made with its pooled form."""

    @classmethod
    def from_config_value(
        cls: type[S], inst_data: ConfigurableClassData | None, config_value: Any
    ) -> S:
        return cls(
            inst_data=inst_data,
            postgres_url=pg_url_from_config(config_value),
            should_autocreate_tables=config_value.get("should_autocreate_tables", True),
            token_provider=get_token_provider_from_config(config_value),
        )


class _Pooled(_Configured):
    """Mixed in before a dagster-postgres store: its `NullPool` engine swapped for a pooled one."""

    _engine: Engine

    def _pool(self, postgres_url: str, should_autocreate_tables: bool, token_provider: Any) -> None:
        # the store made a NullPool engine (and used it to create its tables): it holds nothing
        self._engine = _pooled_engine(postgres_url, token_provider)

    def optimize_for_webserver(
        self, statement_timeout: int, pool_recycle: int, max_overflow: int
    ) -> None:
        self._engine.dispose()  # the webserver's own pool replaces this one
        super().optimize_for_webserver(  # type: ignore[misc]
            statement_timeout, pool_recycle, max_overflow
        )

    def dispose(self) -> None:
        super().dispose()  # type: ignore[misc]
        self._engine.dispose()


class PooledPostgresEventLogStorage(_Pooled, PostgresEventLogStorage):
    """`PostgresEventLogStorage` that reuses its connection between events."""


class PooledPostgresRunStorage(_Pooled, PostgresRunStorage):
    """`PostgresRunStorage` that reuses its connection between reads and updates of runs."""


class PooledPostgresStorage(_Configured, DagsterPostgresStorage):
    """dagster-postgres's storage (`storage: postgres:`) with the pooled stores above.

    Named in `dagster.yaml` as `storage: custom:` (digest_pipeline.instance); its config is
    `storage: postgres:`'s. A run worker's or step process's instance, rebuilt from the run's
    instance reference, is this class again (the reference names it as the unified storage).
    The schedule storage stays dagster-postgres's own: it is used per tick, not per event.
    """

    def _pool(self, postgres_url: str, should_autocreate_tables: bool, token_provider: Any) -> None:
        # the NullPool stores the parent made hold no connection: replaced, not disposed
        self._event_log_storage = PooledPostgresEventLogStorage(
            postgres_url, should_autocreate_tables, token_provider=token_provider
        )
        self._run_storage = PooledPostgresRunStorage(
            postgres_url, should_autocreate_tables, token_provider=token_provider
        )
