"""The composition root: the ledger, mailer, composer and deliverer built from `Settings`.

Every face (the Dagster resources and ops, the `digest` command, the rigs and benchmarks) turns
configuration into adapters and a delivery worker here, and nowhere else.
"""

import random

from sqlalchemy import Engine

from digest_pipeline.adapters.mail.http import HttpProviderMailer
from digest_pipeline.adapters.mail.outbox import OutboxMailer
from digest_pipeline.adapters.mail.render import Jinja2Composer
from digest_pipeline.adapters.mail.smtp import SmtpMailer
from digest_pipeline.adapters.sql.engine import create_ledger_engine, migrate
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.retry import RandomSource
from digest_pipeline.ports import Clock, Composer, Ledger, Mailer
from digest_pipeline.runtime.executor import executor_for
from digest_pipeline.services.deliver import Deliverer
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
    """The Jinja2 digest composer with the configured sender, unsubscribe link and address."""
    return Jinja2Composer(
        sender=settings.from_address,
        unsubscribe_url=settings.unsubscribe_url,
        unsubscribe_secret=settings.unsubscribe_secret,
        clock=clock,
        postal_address=settings.postal_address,
        message_id_domain=settings.message_id_domain,
    )


def migrated_engine(url: str, *, pool_size: int = 10) -> Engine:
    """The ledger database at `url`, created or brought to the current schema."""
    engine = create_ledger_engine(url, pool_size=pool_size)
    migrate(engine)
    return engine


def ledger_on(engine: Engine) -> SqlLedger:
    """The SQL ledger on an engine whose schema is current."""
    return SqlLedger(engine)


def build_deliverer(
    *,
    ledger: Ledger,
    mailer: Mailer,
    composer: Composer,
    clock: Clock,
    policy: DeliveryPolicy,
    owner: str,
    rand: RandomSource | None = None,
) -> Deliverer:
    """A delivery worker; `rand` (the retry jitter) defaults to a fresh `random.Random`."""
    return Deliverer(
        ledger=ledger,
        mailer=mailer,
        composer=composer,
        clock=clock,
        policy=policy,
        rand=rand if rand is not None else random.Random().random,
        owner=owner,
        executor=executor_for(ledger),
    )
