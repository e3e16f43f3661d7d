"""The Dagster composition root: resources that vend the ports, configured from `DIGEST_*`.

Every setting is read at run time, inside `create_resource` or a method, through
`settings.load_settings(os.environ, Path.cwd())`, so each has the working default of design §7 and
nothing reads the environment at import or definitions-load time. `dg.EnvVar` is not the default
binding because Dagster fails a run whose `EnvVar` names an unset variable
(`dagster/_config/source.py::_ensure_env_variable`). Instead every resource has optional fields,
named after their variable without `DIGEST_` (`database_url` for `DIGEST_DATABASE_URL`), that
override the environment when set; an operator may bind `dg.EnvVar(...)` to any of them for a
variable they do set. Bind secrets (`smtp_password`, `provider_api_key`) only through
`dg.EnvVar` or not at all: a literal value would be shown in the UI.
"""

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field, PrivateAttr
from sqlalchemy import Engine

from digest_pipeline import wiring
from digest_pipeline.adapters.clock import SystemClock
from digest_pipeline.component.layered_env import instance_env
from digest_pipeline.component.run_ledger import REFUSED, open_run_ledger
from digest_pipeline.domain.breaker import DEFAULT_THRESHOLD
from digest_pipeline.domain.catalogue import PicksRule, popular_in_your_categories
from digest_pipeline.domain.model import CleanupMode
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.waves import claim_size
from digest_pipeline.ports import Composer, CustomerSource, Ledger, Mailer
from digest_pipeline.settings import InvalidSetting, Settings, load_settings
from digest_pipeline.source_settings import InvalidSource
from digest_pipeline.wiring import build_composer, build_mailer


def _load(instance: Mapping[str, str], **overrides: object) -> Settings:
    """The settings of an instance: the environment, its own values, then every non-None override.

    `instance` holds the instance's `DIGEST_*` values (its YAML); an override stands in for
    its `DIGEST_*` variable.
    """
    env = instance_env(instance)
    env.update({f"DIGEST_{k.upper()}": str(v) for k, v in overrides.items() if v is not None})
    return load_settings(env, Path.cwd())


def open_ledger_engine(
    context: dg.InitResourceContext, instance: Mapping[str, str], database_url: str | None
) -> Engine:
    """The run's ledger database, migrated; refuses (fails closed) when it is not the run's."""
    url = _load(instance, database_url=database_url).database_url
    implicit = database_url is None and not instance_env(instance).get("DIGEST_DATABASE_URL")
    return open_run_ledger(
        context, url, implicit, wiring.migrated_engine, SystemClock().now(), os.environ
    )


class _InstanceResource(dg.ConfigurableResource[Any]):
    """A resource of one digest instance: `instance_settings` are that instance's own values."""

    #: the instance's `DIGEST_*` values, laid over the environment (its YAML; never a secret)
    instance_settings: dict[str, str] = Field(default_factory=dict)

    def _settings(self, **overrides: object) -> Settings:
        return _load(self.instance_settings, **overrides)

    def _fields(self, exclude: set[str] | None = None) -> dict[str, Any]:
        """This resource's own setting fields (`instance_settings` aside), by name."""
        return self.model_dump(exclude={"instance_settings", *(exclude or ())})


class _EngineResource(_InstanceResource):
    """Opens (and migrates) the ledger database for one run; disposes of it afterwards."""

    database_url: str | None = None
    _engine: Engine | None = PrivateAttr(default=None)

    def _open(self, context: dg.InitResourceContext) -> Engine:
        self._engine = open_ledger_engine(context, self.instance_settings, self.database_url)
        return self._engine

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._engine is not None:
            self._engine.dispose()


class LedgerResource(_EngineResource):
    """The SQL ledger on `DIGEST_DATABASE_URL` (an SQLite file under `.digest/` by default)."""

    def create_resource(self, context: dg.InitResourceContext) -> Ledger:
        engine = self._open(context)
        instance = self._settings(database_url=self.database_url).instance
        return wiring.ledger_on(engine, instance=instance, now=SystemClock().now())


class CustomerSourceResource(_EngineResource):
    """The shop's customers, catalogue and orders: the demo tables, or `DIGEST_SOURCE_*`'s."""

    def create_resource(self, context: dg.InitResourceContext) -> CustomerSource:
        settings, engine = self._settings(database_url=self.database_url), self._open(context)
        try:
            return wiring.build_customer_source(settings, engine)
        except InvalidSource as exc:
            # a resource's error reaches `digest run` without its cause; the run's event log
            # keeps the refusal's own line, as for the ledger's (component/run_ledger.py)
            if context.log is not None:
                context.log.error(f"{REFUSED}{exc}")
            raise


class MailerResource(_InstanceResource):
    """The mailer `DIGEST_MAILER` names: `outbox` (default), `smtp`, `http`, `postmark`, `sendgrid` or `ses`."""

    mailer: str | None = None
    outbox_dir: str | None = None
    smtp_host: str | None = None
    smtp_port: int | None = None
    smtp_username: str | None = None
    smtp_password: str | None = None
    smtp_security: str | None = None
    smtp_timeout_seconds: float | None = None
    provider_url: str | None = None
    provider_api_key: str | None = None
    provider_timeout_seconds: float | None = None
    provider_idempotency_window_seconds: float | None = None

    _mailer: Mailer | None = PrivateAttr(default=None)

    def create_resource(self, context: dg.InitResourceContext) -> Mailer:
        self._mailer = build_mailer(self._settings(**self._fields()))
        return self._mailer

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        # SMTP connections and the HTTP client would otherwise live until the process exits
        if self._mailer is not None:
            self._mailer.close()


class ComposerResource(_InstanceResource):
    """The Jinja2 digest composer with the configured sender, unsubscribe link and address."""

    from_address: str | None = None
    unsubscribe_url: str | None = None
    unsubscribe_secret: str | None = None
    postal_address: str | None = None
    message_id_domain: str | None = None

    def create_resource(self, context: dg.InitResourceContext) -> Composer:
        return build_composer(self._settings(**self._fields()), SystemClock())


@dataclass(frozen=True)
class DeliverySettings:
    """The delivery gate's bounds and the fan-out, as the assets, checks and sensor use them."""

    policy: DeliveryPolicy
    batch_size: int
    concurrency: int
    cleanup_mode: CleanupMode
    #: `stale_items` warns when the oldest waiting item of a period is older than this (seconds)
    stale_after_seconds: float
    #: `dead_letter_volume` warns above this share of (dead-lettered + failed) / eligible
    dead_letter_rate_threshold: float
    #: consecutive same-code failures that stop a delivery step (`DIGEST_BREAKER_THRESHOLD`)
    breaker_threshold: int = DEFAULT_THRESHOLD
    #: processes delivering one batch step's items (`DIGEST_DELIVERY_PROCESSES`)
    delivery_processes: int = 1
    #: `DIGEST_ALLOW_NONDURABLE_LEDGER`: deliver on a database that can lose commits (unsafe)
    allow_nondurable_ledger: bool = False
    #: `DIGEST_OPERATORS`: who may grant a late window (every name when empty)
    operators: frozenset[str] = frozenset()
    #: `DIGEST_PICKS_RULE`: what content generation picks for each customer
    picks_rule: PicksRule = popular_in_your_categories

    @property
    def claim_size(self) -> int:
        """Items a delivery step leases at a time (`domain.waves.claim_size`)."""
        return claim_size(self.batch_size, self.concurrency)

    @property
    def step_items(self) -> int:
        """Items one delivery batch step takes: `batch_size` for each of its processes.

        A process's share stays a full batch: a share of half of one would spend much of its
        time starting and draining (README, "Delivery processes").
        """
        return self.batch_size * self.delivery_processes


class DeliveryResource(_InstanceResource):
    """Retry bounds, lease, window, batch, concurrency and cleanup mode, plus warning thresholds.

    The thresholds of `stale_items` and `dead_letter_volume` have no `DIGEST_*` variable; they
    are this resource's configuration (bind a value, or set it in the launchpad's run config).
    """

    batch_size: int | None = None
    concurrency: int | None = None
    cleanup_mode: str | None = None
    retry_base_seconds: float | None = None
    retry_cap_seconds: float | None = None
    retry_max_attempts: int | None = None
    retry_max_age_seconds: float | None = None
    lease_seconds: float | None = None
    delivery_window_seconds: float | None = None
    unknown_retention_seconds: float | None = None
    late_window_seconds: float | None = None
    breaker_threshold: int | None = None
    delivery_processes: int | None = None
    stale_after_seconds: float = 6 * 3600.0
    dead_letter_rate_threshold: float = 0.05

    def settings(self) -> DeliverySettings:
        """Reads the `DIGEST_*` delivery settings now; a bad value raises InvalidSetting."""
        fields = self._fields(exclude={"stale_after_seconds", "dead_letter_rate_threshold"})
        s = self._settings(**fields)
        if not self.stale_after_seconds > 0:
            raise InvalidSetting("stale_after_seconds must be a positive number of seconds")
        if not 0 <= self.dead_letter_rate_threshold <= 1:
            raise InvalidSetting("dead_letter_rate_threshold must be between 0 and 1")
        return DeliverySettings(
            s.policy,
            s.batch_size,
            s.concurrency,
            s.cleanup_mode,
            self.stale_after_seconds,
            self.dead_letter_rate_threshold,
            s.breaker_threshold,
            s.delivery_processes,
            s.allow_nondurable_ledger,
            s.operators,
            s.shop.picks_rule,
        )
