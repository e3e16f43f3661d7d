"""`WeeklyDigest`: the whole weekly graph as one Dagster component, configured in YAML.

A `defs.yaml` under a project's defs folder (`dg.load_from_defs_folder`) makes one instance:
its partitions, five assets with their checks, weekly job, schedule, retry sweeper and resources.
Every attribute stands for a `DIGEST_*` setting of that instance, laid over the process's
environment; secrets and process-wide settings stay in the environment, so a YAML file never
holds a password or a key. Two instances need two names and two ledgers.
"""

from collections.abc import Mapping

import dagster as dg
from pydantic import Field

from digest_pipeline.component.build import build_defs
from digest_pipeline.component.naming import Names
from digest_pipeline.component.registry import register
from digest_pipeline.component.spec import DEFAULT_CRON, DigestSpec
from digest_pipeline.domain.periods import DEFAULT_INSTANCE, validate_instance_name
from digest_pipeline.setting_values import InvalidSetting
from digest_pipeline.settings_catalogue import SETTINGS

#: settings an instance's YAML may not set: secrets (a YAML file is shown and committed), the
#: instance's own name (its `name`), and what one process shares among all its instances
NOT_IN_YAML = frozenset(
    {
        "DIGEST_SMTP_PASSWORD",
        "DIGEST_PROVIDER_API_KEY",
        "DIGEST_UNSUBSCRIBE_SECRET",
        "DIGEST_UNSUBSCRIBE_SECRET_PREVIOUS",
        "DIGEST_WEBHOOK_SECRETS",
        "DIGEST_INSTANCE",
        "DIGEST_EXECUTOR",
        "DIGEST_CELERY_BROKER_URL",
        "DIGEST_CELERY_BACKEND_URL",
        "DIGEST_LOG_LEVEL",
    }
)
KNOWN = frozenset(s.name for s in SETTINGS)


class Source(dg.Resolvable, dg.Model):
    """The shop's own database and how its tables map to customers, products and orders."""

    database_url: str | None = Field(None, description="DIGEST_SOURCE_DATABASE_URL")
    config: str | None = Field(None, description="DIGEST_SOURCE_CONFIG: the mapping's YAML file")


class Brand(dg.Resolvable, dg.Model):
    """What the digest says about the shop and how it looks."""

    shop_name: str | None = Field(None, description="DIGEST_SHOP_NAME")
    postal_address: str | None = Field(None, description="DIGEST_POSTAL_ADDRESS")
    logo_url: str | None = Field(None, description="DIGEST_BRAND_LOGO_URL")
    color: str | None = Field(None, description="DIGEST_BRAND_COLOR")
    background_color: str | None = Field(None, description="DIGEST_BRAND_BACKGROUND_COLOR")
    locale: str | None = Field(None, description="DIGEST_LOCALE")


class MailerConfig(dg.Resolvable, dg.Model):
    """Which mailer sends, and from where (its secret stays in the environment)."""

    kind: str | None = Field(
        None, description="DIGEST_MAILER: outbox, smtp, http (or resend), postmark, sendgrid or ses"
    )
    from_address: str | None = Field(None, description="DIGEST_FROM_ADDRESS")
    outbox_dir: str | None = Field(None, description="DIGEST_OUTBOX_DIR")
    smtp_host: str | None = Field(None, description="DIGEST_SMTP_HOST")
    smtp_port: int | None = Field(None, description="DIGEST_SMTP_PORT")
    smtp_username: str | None = Field(None, description="DIGEST_SMTP_USERNAME")
    provider_url: str | None = Field(None, description="DIGEST_PROVIDER_URL")


class WeeklyDigest(dg.Component, dg.Resolvable, dg.Model):
    """A weekly per-customer digest, delivered exactly once in effect, as a Dagster asset graph.

    The default `name`, `digest`, keeps the graph's own names (`eligibility_snapshot`,
    `weekly_digest_job`) and operation keys (`digest:2026-W42:customer-1842`); any other name
    prefixes every asset key, job, schedule, sensor and resource, and every operation key.
    """

    name: str = Field(DEFAULT_INSTANCE, description="the instance's name (DIGEST_INSTANCE)")
    database_url: str | None = Field(None, description="DIGEST_DATABASE_URL: the ledger")
    first_week: str | None = Field(None, description="DIGEST_FIRST_WEEK, e.g. 2026-W01")
    schedule: str = Field(DEFAULT_CRON, description="the weekly schedule's cron, in UTC")
    source: Source | None = None
    templates: str | None = Field(None, description="DIGEST_TEMPLATE_DIR")
    brand: Brand | None = None
    mailer: MailerConfig | None = None
    picks_rule: str | None = Field(None, description="DIGEST_PICKS_RULE: module:function")
    settings: dict[str, str] = Field(
        default_factory=dict, description="any other DIGEST_* setting, by its variable's name"
    )

    def digest_settings(self) -> dict[str, str]:
        """The instance's `DIGEST_*` values; InvalidSetting (one line) for a name it may not set."""
        try:
            name = validate_instance_name(self.name)
        except ValueError as e:
            raise InvalidSetting(f"WeeklyDigest name: {e}") from e
        for key in sorted(self.settings):
            if key in NOT_IN_YAML:
                raise InvalidSetting(
                    f"instance {name}: {key} may not be set in its YAML (a secret, or shared by "
                    "the whole process): set it in the environment"
                )
            if key not in KNOWN:
                raise InvalidSetting(f"instance {name}: {key} is not a DIGEST_* setting")
        typed: dict[str, object] = {
            "DIGEST_DATABASE_URL": self.database_url,
            "DIGEST_FIRST_WEEK": self.first_week,
            "DIGEST_TEMPLATE_DIR": self.templates,
            "DIGEST_PICKS_RULE": self.picks_rule,
            **_prefixed("DIGEST_SOURCE_", self.source),
            **_fields(self.brand, _BRAND),
            **_fields(self.mailer, _MAILER),
        }
        given = {k: str(v) for k, v in typed.items() if v is not None}
        if clash := sorted(given.keys() & self.settings.keys()):
            raise InvalidSetting(f"instance {name}: {clash[0]} is set twice in its YAML")
        return {**self.settings, **given, "DIGEST_INSTANCE": name}

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        spec = DigestSpec(Names(self.name), self.digest_settings(), self.schedule)
        register(spec)
        return build_defs(spec)


_BRAND = {
    "shop_name": "DIGEST_SHOP_NAME",
    "postal_address": "DIGEST_POSTAL_ADDRESS",
    "logo_url": "DIGEST_BRAND_LOGO_URL",
    "color": "DIGEST_BRAND_COLOR",
    "background_color": "DIGEST_BRAND_BACKGROUND_COLOR",
    "locale": "DIGEST_LOCALE",
}
_MAILER = {
    "kind": "DIGEST_MAILER",
    "from_address": "DIGEST_FROM_ADDRESS",
    "outbox_dir": "DIGEST_OUTBOX_DIR",
    "smtp_host": "DIGEST_SMTP_HOST",
    "smtp_port": "DIGEST_SMTP_PORT",
    "smtp_username": "DIGEST_SMTP_USERNAME",
    "provider_url": "DIGEST_PROVIDER_URL",
}


def _fields(model: dg.Model | None, names: Mapping[str, str]) -> dict[str, object]:
    """A nested section's values under their `DIGEST_*` names."""
    if model is None:
        return {}
    return {names[k]: v for k, v in model.model_dump().items()}


def _prefixed(prefix: str, model: dg.Model | None) -> dict[str, object]:
    """A section whose fields are its variables' names after `prefix`."""
    if model is None:
        return {}
    return {f"{prefix}{k.upper()}": v for k, v in model.model_dump().items()}
