"""Builds the configured mailer and composer from `Settings`.

Both composition roots (the Dagster resources and the `digest` command) turn configuration into
adapters here, and nowhere else.
"""

from digest_pipeline.adapters.http_mailer import HttpProviderMailer
from digest_pipeline.adapters.outbox_mailer import OutboxMailer
from digest_pipeline.adapters.render import Jinja2Composer
from digest_pipeline.adapters.smtp_mailer import SmtpMailer
from digest_pipeline.ports import Clock, Composer, Mailer
from digest_pipeline.settings import Settings


def build_mailer(settings: Settings) -> Mailer:
    """The mailer `DIGEST_MAILER` names; `load_settings` already checked its settings exist."""
    if settings.mailer == "smtp":
        assert settings.smtp is not None
        return SmtpMailer(settings.smtp)
    if settings.mailer == "http":
        assert settings.provider is not None
        return HttpProviderMailer(settings.provider)
    return OutboxMailer(settings.outbox_dir)


def build_composer(settings: Settings, clock: Clock) -> Composer:
    """The Jinja2 digest composer with the configured sender and unsubscribe link."""
    return Jinja2Composer(
        sender=settings.from_address,
        unsubscribe_url=settings.unsubscribe_url,
        unsubscribe_secret=settings.unsubscribe_secret,
        clock=clock,
    )
