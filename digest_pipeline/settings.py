"""Configuration from `DIGEST_*` environment variables (design §7), validated in one place.

The CLI and the Dagster resources read the same names through `load_settings(environ)`; nothing
reads the environment at import time. A bad value raises `InvalidSetting` with a one-line message
that names the variable. Every number has a documented range (`SECONDS_RANGES`, `INT_RANGES`,
the README's configuration table): finite, and small enough that no clock arithmetic of a run can
overflow, so a bad value stops the command at start instead of crashing a step half way through.
The database URL must name a supported backend and, for SQLite, a file.
"""

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

from digest_pipeline.dkim_settings import DkimSettings, read_dkim, sender_address
from digest_pipeline.domain.breaker import DEFAULT_THRESHOLD
from digest_pipeline.domain.compliance import message_id_domain, postal_address, url_template
from digest_pipeline.domain.durability import ALLOW_VARIABLE
from digest_pipeline.domain.errors import InvalidInstanceName, InvalidPolicy
from digest_pipeline.domain.model import CleanupMode
from digest_pipeline.domain.periods import (
    DEFAULT_INSTANCE,
    FIRST_PERIOD,
    INSTANCE_RULE,
    Period,
    validate_instance_name,
)
from digest_pipeline.domain.policy import MAX_SEND_RATE, MIN_SEND_RATE, DeliveryPolicy
from digest_pipeline.domain.retry import RetryPolicy
from digest_pipeline.domain.unsubscribe import DEMO_UNSUBSCRIBE_SECRET
from digest_pipeline.domain.webhooks import DEFAULT_TOLERANCE
from digest_pipeline.ses_settings import SesSettings, read_ses
from digest_pipeline.setting_values import DATABASE_SCHEMES as DATABASE_SCHEMES
from digest_pipeline.setting_values import InvalidSetting as InvalidSetting
from digest_pipeline.setting_values import check_database_url, read_value
from digest_pipeline.shop_settings import ShopSettings, read_shop
from digest_pipeline.sns_settings import SnsSettings, read_sns
from digest_pipeline.source_settings import SourceSettings, read_source
from digest_pipeline.webhook_settings import WebhookSecret, read_webhook_secrets

T = TypeVar("T")
MAILERS = ("outbox", "smtp", "http", "postmark", "sendgrid", "ses")
#: other names `DIGEST_MAILER` accepts, for the mailer they stand for
MAILER_ALIASES = {"resend": "http"}
#: `DIGEST_PROVIDER_URL` when unset, by mailer (the Resend-style `http` has no default)
DEFAULT_PROVIDER_URLS = {
    "postmark": "https://api.postmarkapp.com",
    "sendgrid": "https://api.sendgrid.com",
}
#: `DIGEST_CONCURRENCY` when unset, by `DIGEST_MAILER`. A relay or a provider allows about 16
#: connections; the outbox's sends are local file links, where a wave of 256 needs a quarter of
#: the ledger transactions of 64 (less delivery time) and every `unknown` a
#: crash leaves is settled by lookup.
#: what a provider calls the credential `DIGEST_PROVIDER_API_KEY` holds
_KEY_NAMES = {"postmark": "the Postmark server token", "sendgrid": "the SendGrid API key"}
DEFAULT_CONCURRENCY = {m: 256 if m == "outbox" else 16 for m in MAILERS}
#: `DIGEST_BATCH_SIZE` when unset: a 100,000-customer week is four delivery steps. A step in a
#: process of its own (multiprocess, Celery) costs seconds to start and Dagster's rows, and the
#: steps that run at once share the remaining due items through their claims (README).
DEFAULT_BATCH_SIZE = 25_000
_DAY = 86_400.0
_TIMEOUT = timedelta(seconds=10)  # `DIGEST_PROVIDER_TIMEOUT_SECONDS` when unset
#: (least, most) seconds each duration accepts. The upper bounds keep `now + value` far from
#: datetime's year 9999 and a lease or retry inside a month; windows stop at a leap year.
SECONDS_RANGES: dict[str, tuple[float, float]] = {
    "DIGEST_RETRY_BASE_SECONDS": (0.001, _DAY),
    "DIGEST_RETRY_CAP_SECONDS": (0.001, 30 * _DAY),
    "DIGEST_RETRY_MAX_AGE_SECONDS": (1.0, 366 * _DAY),
    "DIGEST_LEASE_SECONDS": (1.0, 30 * _DAY),
    "DIGEST_DELIVERY_WINDOW_SECONDS": (1.0, 366 * _DAY),
    "DIGEST_UNKNOWN_RETENTION_SECONDS": (1.0, 366 * _DAY),
    "DIGEST_LATE_WINDOW_SECONDS": (1.0, 366 * _DAY),
    "DIGEST_SMTP_TIMEOUT_SECONDS": (0.1, 3_600.0),
    "DIGEST_PROVIDER_TIMEOUT_SECONDS": (0.1, 3_600.0),
    "DIGEST_PROVIDER_IDEMPOTENCY_WINDOW_SECONDS": (1.0, 30 * _DAY),
    # a signed webhook older (or newer) than this is refused; an hour covers any clock skew
    "DIGEST_WEBHOOK_TOLERANCE_SECONDS": (1.0, 3_600.0),
    "DIGEST_SERVE_HEADER_TIMEOUT_SECONDS": (0.1, 3_600.0),
    "DIGEST_SERVE_BODY_TIMEOUT_SECONDS": (0.1, 3_600.0),
    "DIGEST_SERVE_KEEP_ALIVE_SECONDS": (0.1, 3_600.0),
}
#: (least, most) each whole-number setting accepts
INT_RANGES: dict[str, tuple[int, int]] = {
    "DIGEST_RETRY_MAX_ATTEMPTS": (1, 1_000),
    # a thread per send in flight; the claim takes 8 waves of it (defs/resources.py)
    "DIGEST_CONCURRENCY": (1, 1_024),
    "DIGEST_BATCH_SIZE": (1, 1_000_000),
    "DIGEST_SMTP_PORT": (1, 65_535),
    # consecutive same-code failures that stop a delivery run; 0 turns the breaker off
    "DIGEST_BREAKER_THRESHOLD": (0, 1_000_000),
    # processes delivering one batch step's items (runtime/helpers.py): one per core at most
    "DIGEST_DELIVERY_PROCESSES": (1, 64),
    "DIGEST_SERVE_MAX_CONNECTIONS": (1, 100_000),
}


SMTP_SECURITY = ("none", "starttls", "tls")
#: what an on/off setting accepts
_YES, _NO = ("1", "true", "yes"), ("0", "false", "no")
_STREAM_ID = re.compile(r"[a-z0-9_-]{1,30}")


@dataclass(frozen=True)
class SmtpSettings:
    """`DIGEST_SMTP_*`: the relay the SMTP mailer talks to."""

    host: str
    port: int
    username: str | None
    password: str | None = field(repr=False)
    security: str
    timeout_seconds: float
    #: `DIGEST_DKIM_*`: the key the mailer signs with (dkim_settings.py); None: unsigned
    dkim: DkimSettings | None = None


@dataclass(frozen=True)
class ProviderSettings:
    """`DIGEST_PROVIDER_*`: an HTTP email API (Resend-style `http`, `postmark` or `sendgrid`)."""

    url: str
    api_key: str = field(repr=False)
    timeout_seconds: float
    #: how long the provider deduplicates a repeated idempotency key (not Postmark: it has none)
    idempotency_window: timedelta
    #: `DIGEST_POSTMARK_MESSAGE_STREAM`: the Postmark stream digests go out on (bulk: broadcast)
    message_stream: str = "broadcast"


#: `digest serve`'s default address; the default unsubscribe link points at it
DEFAULT_SERVE_HOST, DEFAULT_SERVE_PORT = "127.0.0.1", 8025
DEFAULT_UNSUBSCRIBE_URL = (
    f"http://{DEFAULT_SERVE_HOST}:{DEFAULT_SERVE_PORT}/unsubscribe/{{customer_id}}?token={{token}}"
)


@dataclass(frozen=True)
class ServeLimits:
    """`DIGEST_SERVE_*`: `digest serve`'s deadlines on one connection, and its cap (serve/guard.py)."""

    header_timeout: timedelta = timedelta(seconds=10)
    #: a total from the end of the head, so a body trickled a byte at a time is cut too
    body_timeout: timedelta = timedelta(seconds=10)
    keep_alive: timedelta = timedelta(seconds=10)
    #: below Linux's default 1,024 open files, so the cap refuses before descriptors run out
    max_connections: int = 512


@dataclass(frozen=True)
class Settings:
    database_url: str
    source: SourceSettings
    mailer: str
    outbox_dir: Path
    from_address: str
    policy: DeliveryPolicy
    batch_size: int
    concurrency: int
    cleanup_mode: CleanupMode
    #: `{customer_id}` and `{token}` are filled in per customer (RFC 8058 one-click link)
    unsubscribe_url: str
    unsubscribe_secret: str = field(repr=False)
    #: the secret a rotation replaced, which `digest serve` accepts during the overlap the ledger
    #: records (`DIGEST_UNSUBSCRIBE_SECRET_PREVIOUS`; services/link_secrets.py)
    unsubscribe_secret_previous: str | None = field(default=None, repr=False)
    smtp: SmtpSettings | None = None
    provider: ProviderSettings | None = None
    ses: SesSettings | None = None  # `DIGEST_SES_*` and AWS credentials: ses_settings.py
    #: who may resolve and replay (`DIGEST_OPERATORS`, comma-separated); empty: anyone
    operators: frozenset[str] = frozenset()
    #: consecutive same-code failures that stop a delivery run (`DIGEST_BREAKER_THRESHOLD`; 0: off)
    breaker_threshold: int = DEFAULT_THRESHOLD
    #: the providers whose signed webhooks `digest serve` accepts (`DIGEST_WEBHOOK_SECRETS`)
    webhook_secrets: tuple[WebhookSecret, ...] = field(default=(), repr=False)
    #: the replay window of a signed webhook (`DIGEST_WEBHOOK_TOLERANCE_SECONDS`)
    webhook_tolerance: timedelta = DEFAULT_TOLERANCE
    #: `/events/ses`: the SNS topics and certificate hosts it trusts (sns_settings.py)
    sns: SnsSettings | None = None
    #: processes that deliver one batch step's items (`DIGEST_DELIVERY_PROCESSES`)
    delivery_processes: int = 1
    serve_limits: ServeLimits = field(default_factory=ServeLimits)
    #: deliver on a PostgreSQL that can lose commits (`DIGEST_ALLOW_NONDURABLE_LEDGER`; unsafe)
    allow_nondurable_ledger: bool = False
    #: `DIGEST_POSTAL_ADDRESS`: the sender's postal address in every digest's footer (CAN-SPAM)
    postal_address: str | None = None
    shop: ShopSettings = field(default_factory=ShopSettings)  # look and picks: shop_settings.py
    #: `DIGEST_MESSAGE_ID_DOMAIN`: the Message-ID's right-hand side; None: the sender's domain
    message_id_domain: str | None = None
    #: `DIGEST_FIRST_WEEK`: the weekly partitions' first week; None: the ledger's (defs/partitions.py)
    first_week: Period | None = None
    #: `DIGEST_INSTANCE`: the digest instance whose ledger this is, the first part of its keys
    instance: str = DEFAULT_INSTANCE

    def webhook_keys(self) -> dict[str, tuple[bytes, ...]]:
        """Each configured provider's signing keys (two during a rotation)."""
        keys: dict[str, tuple[bytes, ...]] = {}
        for s in self.webhook_secrets:
            keys[s.provider] = (*keys.get(s.provider, ()), s.key)
        return keys


def default_database_url(root: Path) -> str:
    """The embedded default: a SQLite file under `.digest/` in the project folder."""
    return f"sqlite:///{(root / '.digest' / 'digest.db').resolve()}"


def _duration(env: Mapping[str, str], name: str, default: timedelta) -> timedelta:
    """`name`'s duration in seconds, within its `SECONDS_RANGES` bounds, or `default`."""
    return read_value(env, name, default, _seconds(name))


def _whole_number(env: Mapping[str, str], name: str, default: int) -> int:
    """`name`'s whole number, within its `INT_RANGES` bounds, or `default`."""
    return read_value(env, name, default, _whole(name))


def _number(value: float) -> str:
    return f"{value:g}" if value < 1e6 else f"{value:.0f}"


def _seconds_text(value: float) -> str:
    """`0.001`, `3600`, `2592000 (30 days)`: the day count where the seconds are hard to read."""
    days = value / _DAY
    if days < 1:
        return _number(value)
    return f"{_number(value)} ({_number(days)} day{'s' if days != 1 else ''})"


def range_text(name: str) -> str:
    """The range of a numeric setting as its refusal and the README state it.

    `0.001 to 86400 (1 day)` for a duration in seconds, `1 to 1024` for a whole number.
    """
    if name in SECONDS_RANGES:
        low, high = SECONDS_RANGES[name]
        return f"{_seconds_text(low)} to {_seconds_text(high)}"
    low_int, high_int = INT_RANGES[name]
    return f"{low_int} to {high_int}"


def _whole(name: str) -> Callable[[str], int]:
    """A parser of `name`'s whole number within its `INT_RANGES` bounds."""
    low, high = INT_RANGES[name]

    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:  # not a whole number, or more digits than int() reads
            value = None
        if value is None or not low <= value <= high:
            raise ValueError(f"must be a whole number from {range_text(name)}")
        return value

    return parse


def _within(raw: str, low: float, high: float) -> float | None:
    """`raw` as a finite number from `low` to `high`, or None.

    NaN fails every comparison; infinity ("inf", "1e400") is refused before timedelta() could
    raise OverflowError on it.
    """
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) and low <= value <= high else None


def _seconds(name: str) -> Callable[[str], timedelta]:
    """A parser of `name`'s duration: finite seconds within its `SECONDS_RANGES` bounds."""
    low, high = SECONDS_RANGES[name]

    def parse(raw: str) -> timedelta:
        if (value := _within(raw, low, high)) is None:
            raise ValueError(f"must be a number of seconds from {range_text(name)}")
        return timedelta(seconds=value)

    return parse


def _rate(raw: str) -> float:
    """`DIGEST_SEND_RATE`: messages per second for the whole install (domain/pacing.py)."""
    if (value := _within(raw, MIN_SEND_RATE, MAX_SEND_RATE)) is None:
        raise ValueError(f"must be messages per second from {MIN_SEND_RATE:g} to {MAX_SEND_RATE:g}")
    return value


def _database_url(env: Mapping[str, str], default: str) -> str:
    """`DIGEST_DATABASE_URL`: a supported scheme and, for SQLite, a file (never in memory)."""
    raw = env.get("DIGEST_DATABASE_URL", "").strip()
    return check_database_url(raw, "DIGEST_DATABASE_URL", "digest.db") if raw else default


def _instance(raw: str) -> str:
    """`DIGEST_INSTANCE`: a digest instance's name (`domain.periods.validate_instance_name`)."""
    try:
        return validate_instance_name(raw)
    except InvalidInstanceName:
        raise ValueError(f"must be {INSTANCE_RULE}") from None


def _flag(raw: str) -> bool:
    """`1`/`true`/`yes` or `0`/`false`/`no`, in any case; anything else is refused."""
    value = raw.lower()
    if value not in (*_YES, *_NO):
        raise ValueError(f"must be one of {', '.join((*_YES, *_NO))}")
    return value in _YES


def one_of(options: tuple[str, ...]) -> Callable[[str], str]:
    """A parser that accepts exactly one of `options`."""

    def parse(raw: str) -> str:
        if raw not in options:
            raise ValueError(f"must be one of {', '.join(options)}")
        return raw

    return parse


def _smtp(env: Mapping[str, str], required: bool, sender: str) -> SmtpSettings | None:
    host = env.get("DIGEST_SMTP_HOST", "").strip()
    if not host:
        if required:
            raise InvalidSetting("DIGEST_SMTP_HOST is required when DIGEST_MAILER=smtp")
        return None
    security = read_value(env, "DIGEST_SMTP_SECURITY", "starttls", one_of(SMTP_SECURITY))
    default_port = {"none": 25, "starttls": 587, "tls": 465}[security]
    return SmtpSettings(
        host=host,
        port=_whole_number(env, "DIGEST_SMTP_PORT", default_port),
        username=env.get("DIGEST_SMTP_USERNAME") or None,
        password=env.get("DIGEST_SMTP_PASSWORD") or None,
        security=security,
        timeout_seconds=_duration(
            env, "DIGEST_SMTP_TIMEOUT_SECONDS", timedelta(seconds=30)
        ).total_seconds(),
        dkim=_dkim(env, sender),
    )


def _dkim(env: Mapping[str, str], sender: str) -> DkimSettings | None:
    try:
        return read_dkim(env, sender)
    except ValueError as e:  # its message names the variable
        raise InvalidSetting(str(e)) from e


def _webhook_secrets(env: Mapping[str, str]) -> tuple[WebhookSecret, ...]:
    try:
        return read_webhook_secrets(env)
    except ValueError as e:  # its message names the variable, never a secret
        raise InvalidSetting(str(e)) from e


def _mailer(raw: str) -> str:
    """`DIGEST_MAILER`: one of `MAILERS`, or an alias of one (`resend` is `http`)."""
    if raw in MAILER_ALIASES:
        return MAILER_ALIASES[raw]
    return one_of((*MAILERS, *MAILER_ALIASES))(raw)


def _provider(env: Mapping[str, str], mailer: str) -> ProviderSettings | None:
    default_url = DEFAULT_PROVIDER_URLS.get(mailer, "")
    url = (env.get("DIGEST_PROVIDER_URL", "").strip() or default_url).rstrip("/")
    key = env.get("DIGEST_PROVIDER_API_KEY", "").strip()
    if not url or not key:
        if mailer in DEFAULT_PROVIDER_URLS and not key:
            raise InvalidSetting(
                f"DIGEST_PROVIDER_API_KEY ({_KEY_NAMES[mailer]}) is required when "
                f"DIGEST_MAILER={mailer}"
            )
        if mailer == "http":
            raise InvalidSetting(
                "DIGEST_PROVIDER_URL and DIGEST_PROVIDER_API_KEY are required when DIGEST_MAILER=http"
            )
        return None
    if not url.startswith(("http://", "https://")):
        raise InvalidSetting("DIGEST_PROVIDER_URL must start with http:// or https://")
    return ProviderSettings(
        url=url,
        api_key=key,
        timeout_seconds=_duration(env, "DIGEST_PROVIDER_TIMEOUT_SECONDS", _TIMEOUT).total_seconds(),
        idempotency_window=_duration(
            env, "DIGEST_PROVIDER_IDEMPOTENCY_WINDOW_SECONDS", timedelta(hours=24)
        ),
        message_stream=read_value(
            env, "DIGEST_POSTMARK_MESSAGE_STREAM", "broadcast", _message_stream
        ),
    )


def _message_stream(raw: str) -> str:
    """A Postmark message stream ID: lower-case letters, digits, `-` and `_` (Postmark's own)."""
    if not _STREAM_ID.fullmatch(raw):
        raise ValueError("must be a message stream ID: 1-30 lower-case letters, digits, '-' or '_'")
    return raw


def load_settings(env: Mapping[str, str], root: Path) -> Settings:
    """Reads every `DIGEST_*` setting, with the embedded defaults for anything unset."""
    base = RetryPolicy()
    defaults = DeliveryPolicy()
    serve = ServeLimits()

    def duration(name: str, default: timedelta) -> timedelta:
        return _duration(env, name, default)

    def whole(name: str, default: int) -> int:
        return _whole_number(env, name, default)

    try:
        policy = DeliveryPolicy(
            retry=RetryPolicy(
                base=duration("DIGEST_RETRY_BASE_SECONDS", base.base),
                cap=duration("DIGEST_RETRY_CAP_SECONDS", base.cap),
                max_attempts=whole("DIGEST_RETRY_MAX_ATTEMPTS", base.max_attempts),
                max_age=duration("DIGEST_RETRY_MAX_AGE_SECONDS", base.max_age),
            ),
            lease=duration("DIGEST_LEASE_SECONDS", defaults.lease),
            delivery_window=duration("DIGEST_DELIVERY_WINDOW_SECONDS", defaults.delivery_window),
            unknown_retention=duration(
                "DIGEST_UNKNOWN_RETENTION_SECONDS", defaults.unknown_retention
            ),
            late_window=duration("DIGEST_LATE_WINDOW_SECONDS", defaults.late_window),
            send_rate=read_value(env, "DIGEST_SEND_RATE", None, _rate),
        )
    except InvalidPolicy as e:
        raise InvalidSetting(f"retry settings: {e}") from e
    mailer = read_value(env, "DIGEST_MAILER", "outbox", _mailer)
    # checked here, so a bad sender stops the run at start instead of failing every item
    sender = read_value(env, "DIGEST_FROM_ADDRESS", "digest@example.com", sender_address)
    return Settings(
        database_url=_database_url(env, default_database_url(root)),
        source=read_source(env, root),
        mailer=mailer,
        outbox_dir=read_value(env, "DIGEST_OUTBOX_DIR", root / ".digest" / "outbox", Path),
        from_address=sender,
        policy=policy,
        batch_size=whole("DIGEST_BATCH_SIZE", DEFAULT_BATCH_SIZE),
        concurrency=whole("DIGEST_CONCURRENCY", DEFAULT_CONCURRENCY[mailer]),
        cleanup_mode=read_value(env, "DIGEST_CLEANUP_MODE", CleanupMode.ARCHIVE, CleanupMode),
        unsubscribe_url=read_value(
            env, "DIGEST_UNSUBSCRIBE_URL", DEFAULT_UNSUBSCRIBE_URL, url_template
        ),
        # checked against the ledger at start: outside a demo ledger a loopback link or a
        # missing address is refused there (domain/compliance.py); a long address is not repeated
        postal_address=read_value(env, "DIGEST_POSTAL_ADDRESS", None, postal_address, shown=False),
        shop=read_shop(env, root),
        message_id_domain=read_value(env, "DIGEST_MESSAGE_ID_DOMAIN", None, message_id_domain),
        # The demo default is public: `digest run` and `digest serve` refuse it outside the demo
        # (domain/unsubscribe.py), or anyone could forge every customer's link.
        unsubscribe_secret=read_value(
            env, "DIGEST_UNSUBSCRIBE_SECRET", DEMO_UNSUBSCRIBE_SECRET, str
        ),
        unsubscribe_secret_previous=read_value(
            env, "DIGEST_UNSUBSCRIBE_SECRET_PREVIOUS", None, str
        ),
        smtp=_smtp(env, mailer == "smtp", sender),
        provider=_provider(env, mailer),
        ses=read_ses(env, duration("DIGEST_PROVIDER_TIMEOUT_SECONDS", _TIMEOUT))
        if mailer == "ses"
        else None,
        operators=frozenset(
            name.strip() for name in env.get("DIGEST_OPERATORS", "").split(",") if name.strip()
        ),
        breaker_threshold=whole("DIGEST_BREAKER_THRESHOLD", DEFAULT_THRESHOLD),
        webhook_secrets=_webhook_secrets(env),
        webhook_tolerance=duration("DIGEST_WEBHOOK_TOLERANCE_SECONDS", DEFAULT_TOLERANCE),
        sns=read_sns(env),
        delivery_processes=whole("DIGEST_DELIVERY_PROCESSES", 1),
        serve_limits=ServeLimits(
            duration("DIGEST_SERVE_HEADER_TIMEOUT_SECONDS", serve.header_timeout),
            duration("DIGEST_SERVE_BODY_TIMEOUT_SECONDS", serve.body_timeout),
            duration("DIGEST_SERVE_KEEP_ALIVE_SECONDS", serve.keep_alive),
            whole("DIGEST_SERVE_MAX_CONNECTIONS", serve.max_connections),
        ),
        # only a throwaway ledger may say so: it lets a crash send digests twice (design §8)
        allow_nondurable_ledger=read_value(env, ALLOW_VARIABLE, False, _flag),
        first_week=load_first_week(env),
        instance=read_value(env, "DIGEST_INSTANCE", DEFAULT_INSTANCE, _instance),
    )


def load_first_week(env: Mapping[str, str]) -> Period | None:
    """`DIGEST_FIRST_WEEK`, the weekly partitions' first week (2025-W02 or later), or None."""
    week = read_value(env, "DIGEST_FIRST_WEEK", None, Period.parse)
    if week is not None and week < FIRST_PERIOD:
        raise InvalidSetting(f"DIGEST_FIRST_WEEK={week}: must be {FIRST_PERIOD} or later")
    return week
