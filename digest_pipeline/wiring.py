"""The composition root: the ledger, mailer, composer and deliverer built from `Settings`.

Every face (the Dagster resources and ops, the `digest` command, the rigs and benchmarks) turns
configuration into adapters and a delivery worker here, and nowhere else.
"""

import random
from datetime import datetime

from sqlalchemy import Engine

from digest_pipeline.adapters.mail.http import HttpProviderMailer
from digest_pipeline.adapters.mail.outbox import OutboxMailer
from digest_pipeline.adapters.mail.postmark import PostmarkMailer
from digest_pipeline.adapters.mail.render import Jinja2Composer
from digest_pipeline.adapters.mail.sendgrid import SendGridMailer
from digest_pipeline.adapters.mail.smtp import SmtpMailer
from digest_pipeline.adapters.sql.customer_source import SqlCustomerSource
from digest_pipeline.adapters.sql.engine import create_ledger_engine, migrate
from digest_pipeline.adapters.sql.identity import claim_instance
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.adapters.sql.source_mapping import open_mapped_source
from digest_pipeline.domain.periods import DEFAULT_INSTANCE
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.retry import RandomSource
from digest_pipeline.ports import Clock, Composer, CustomerSource, Ledger, Mailer
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
    if settings.mailer == "postmark":
        assert settings.provider is not None
        return PostmarkMailer(settings.provider)
    if settings.mailer == "sendgrid":
        assert settings.provider is not None
        return SendGridMailer(settings.provider)
    if settings.mailer == "ses":
        # boto3 takes a tenth of a second to import: only an SES install pays for it
        from digest_pipeline.adapters.mail.ses import SesMailer

        assert settings.ses is not None
        # a connection for each send a step keeps in flight
        return SesMailer(settings.ses, max_connections=settings.concurrency)
    return OutboxMailer(settings.outbox_dir)


def build_composer(settings: Settings, clock: Clock) -> Composer:
    """The Jinja2 digest composer with the configured sender, link, address, brand and templates.

    Raises:
        InvalidSetting: the templates (`DIGEST_TEMPLATE_DIR`) do not parse, fail on a sample
            digest or leave out the unsubscribe link or the postal address; one line.
    """
    # imported here, where they are used: the rest of the composition root needs neither
    from digest_pipeline.adapters.mail.templates import TemplateRefused
    from digest_pipeline.settings import InvalidSetting

    try:
        return Jinja2Composer(
            sender=settings.from_address,
            unsubscribe_url=settings.unsubscribe_url,
            unsubscribe_secret=settings.unsubscribe_secret,
            clock=clock,
            postal_address=settings.postal_address,
            message_id_domain=settings.message_id_domain,
            brand=settings.shop.brand,
            template_dir=settings.shop.template_dir,
        )
    except TemplateRefused as e:
        raise InvalidSetting(str(e)) from e


def migrated_engine(url: str, *, pool_size: int = 10) -> Engine:
    """The ledger database at `url`, created or brought to the current schema."""
    engine = create_ledger_engine(url, pool_size=pool_size)
    migrate(engine)
    return engine


def ledger_on(engine: Engine, instance: str = DEFAULT_INSTANCE, *, now: datetime) -> SqlLedger:
    """The SQL ledger of digest instance `instance` on an engine whose schema is current.

    The ledger records the instance the first time it is opened and is checked against it every
    time after (`identity.claim_instance`; `now` dates a new identity row: the caller's clock).

    Raises:
        LedgerMismatch: the ledger belongs to another instance; nothing was changed.
        InvalidInstanceName: `instance` is not an instance's name.
    """
    claim_instance(engine, instance, now)
    return SqlLedger(engine, instance)


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


def build_customer_source(settings: Settings, ledger_engine: Engine) -> CustomerSource:
    """The shop's customers, catalogue and orders, as `DIGEST_SOURCE_*` describe them.

    Unset, the demo tables in the ledger's database, read as they always were. Otherwise the
    shop's database (`DIGEST_SOURCE_DATABASE_URL`, the ledger's when unset) through the mapping
    of `DIGEST_SOURCE_CONFIG`, checked against the database before it is returned.

    Raises:
        InvalidSource: the source cannot be read as configured (one line; nothing was read).
    """
    if settings.source.is_default:
        return SqlCustomerSource(ledger_engine)
    return open_mapped_source(settings.source, ledger_engine)
