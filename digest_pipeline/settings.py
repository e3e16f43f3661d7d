"""Configuration from `DIGEST_*` environment variables (design §7), validated in one place.

The CLI and the Dagster resources read the same names through `load_settings(environ)`; nothing
reads the environment at import time. A bad value raises `InvalidSetting` with a one-line message
that names the variable.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from email.policy import SMTP
from pathlib import Path
from typing import TypeVar

from digest_pipeline.domain.errors import DigestError, InvalidPolicy
from digest_pipeline.domain.model import CleanupMode
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.retry import RetryPolicy

T = TypeVar("T")
MAILERS = ("outbox", "smtp", "http")


class InvalidSetting(DigestError, ValueError):
    """An environment variable holds a value the project cannot use."""


SMTP_SECURITY = ("none", "starttls", "tls")


@dataclass(frozen=True)
class SmtpSettings:
    """`DIGEST_SMTP_*`: the relay the SMTP mailer talks to."""

    host: str
    port: int
    username: str | None
    password: str | None = field(repr=False)
    security: str
    timeout_seconds: float


@dataclass(frozen=True)
class ProviderSettings:
    """`DIGEST_PROVIDER_*`: a Resend-style HTTP email API that honours `Idempotency-Key`."""

    url: str
    api_key: str = field(repr=False)
    timeout_seconds: float
    #: how long the provider deduplicates a repeated idempotency key
    idempotency_window: timedelta


@dataclass(frozen=True)
class Settings:
    database_url: str
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
    smtp: SmtpSettings | None = None
    provider: ProviderSettings | None = None
    #: who may resolve and replay (`DIGEST_OPERATORS`, comma-separated); empty: anyone
    operators: frozenset[str] = frozenset()


def default_database_url(root: Path) -> str:
    """The embedded default: a SQLite file under `.digest/` in the project folder."""
    return f"sqlite:///{(root / '.digest' / 'digest.db').resolve()}"


def _read(env: Mapping[str, str], name: str, default: T, parse: Callable[[str], T]) -> T:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return parse(raw)
    except ValueError as e:
        raise InvalidSetting(f"{name}={raw!r}: {e}") from e


def _sender(raw: str) -> str:
    """One address as a From header holds it: `digest@shop.example` or `Shop <digest@…>`."""
    try:
        header = SMTP.header_factory("From", raw)
        ok = len(header.addresses) == 1 and not header.defects
        ok = ok and bool(header.addresses[0].username and header.addresses[0].domain)
    except Exception:
        # the email package's parser crashes (IndexError, AttributeError, …) on some inputs
        ok = False
    if not ok:
        raise ValueError("must be one email address, e.g. digest@shop.example")
    return raw


def _positive_int(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise ValueError("must be a whole number of at least 1")
    return value


def _seconds(raw: str) -> timedelta:
    value = float(raw)
    if not value > 0:
        raise ValueError("must be a positive number of seconds")
    return timedelta(seconds=value)


def _choice(options: tuple[str, ...]) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        if raw not in options:
            raise ValueError(f"must be one of {', '.join(options)}")
        return raw

    return parse


def _port(raw: str) -> int:
    value = int(raw)
    if not 0 < value < 65536:
        raise ValueError("must be a TCP port (1-65535)")
    return value


def _smtp(env: Mapping[str, str], required: bool) -> SmtpSettings | None:
    host = env.get("DIGEST_SMTP_HOST", "").strip()
    if not host:
        if required:
            raise InvalidSetting("DIGEST_SMTP_HOST is required when DIGEST_MAILER=smtp")
        return None
    security = _read(env, "DIGEST_SMTP_SECURITY", "starttls", _choice(SMTP_SECURITY))
    default_port = {"none": 25, "starttls": 587, "tls": 465}[security]
    return SmtpSettings(
        host=host,
        port=_read(env, "DIGEST_SMTP_PORT", default_port, _port),
        username=env.get("DIGEST_SMTP_USERNAME") or None,
        password=env.get("DIGEST_SMTP_PASSWORD") or None,
        security=security,
        timeout_seconds=_read(
            env, "DIGEST_SMTP_TIMEOUT_SECONDS", timedelta(seconds=30), _seconds
        ).total_seconds(),
    )


def _provider(env: Mapping[str, str], required: bool) -> ProviderSettings | None:
    url = env.get("DIGEST_PROVIDER_URL", "").strip().rstrip("/")
    key = env.get("DIGEST_PROVIDER_API_KEY", "").strip()
    if not url or not key:
        if required:
            raise InvalidSetting(
                "DIGEST_PROVIDER_URL and DIGEST_PROVIDER_API_KEY are required when DIGEST_MAILER=http"
            )
        return None
    if not url.startswith(("http://", "https://")):
        raise InvalidSetting("DIGEST_PROVIDER_URL must start with http:// or https://")
    return ProviderSettings(
        url=url,
        api_key=key,
        timeout_seconds=_read(
            env, "DIGEST_PROVIDER_TIMEOUT_SECONDS", timedelta(seconds=10), _seconds
        ).total_seconds(),
        idempotency_window=_read(
            env, "DIGEST_PROVIDER_IDEMPOTENCY_WINDOW_SECONDS", timedelta(hours=24), _seconds
        ),
    )


def load_settings(env: Mapping[str, str], root: Path) -> Settings:
    """Reads every `DIGEST_*` setting, with the embedded defaults for anything unset."""
    base = RetryPolicy()
    defaults = DeliveryPolicy()
    try:
        policy = DeliveryPolicy(
            retry=RetryPolicy(
                base=_read(env, "DIGEST_RETRY_BASE_SECONDS", base.base, _seconds),
                cap=_read(env, "DIGEST_RETRY_CAP_SECONDS", base.cap, _seconds),
                max_attempts=_read(
                    env, "DIGEST_RETRY_MAX_ATTEMPTS", base.max_attempts, _positive_int
                ),
                max_age=_read(env, "DIGEST_RETRY_MAX_AGE_SECONDS", base.max_age, _seconds),
            ),
            lease=_read(env, "DIGEST_LEASE_SECONDS", defaults.lease, _seconds),
            delivery_window=_read(
                env, "DIGEST_DELIVERY_WINDOW_SECONDS", defaults.delivery_window, _seconds
            ),
            unknown_retention=_read(
                env, "DIGEST_UNKNOWN_RETENTION_SECONDS", defaults.unknown_retention, _seconds
            ),
            late_window=_read(env, "DIGEST_LATE_WINDOW_SECONDS", defaults.late_window, _seconds),
        )
    except InvalidPolicy as e:
        raise InvalidSetting(f"retry settings: {e}") from e
    mailer = _read(env, "DIGEST_MAILER", "outbox", _choice(MAILERS))
    return Settings(
        database_url=_read(env, "DIGEST_DATABASE_URL", default_database_url(root), str),
        mailer=mailer,
        outbox_dir=_read(env, "DIGEST_OUTBOX_DIR", root / ".digest" / "outbox", Path),
        # checked here, so a bad sender stops the run at start instead of failing every item
        from_address=_read(env, "DIGEST_FROM_ADDRESS", "digest@example.com", _sender),
        policy=policy,
        batch_size=_read(env, "DIGEST_BATCH_SIZE", 5_000, _positive_int),
        concurrency=_read(env, "DIGEST_CONCURRENCY", 16, _positive_int),
        cleanup_mode=_read(env, "DIGEST_CLEANUP_MODE", CleanupMode.ARCHIVE, CleanupMode),
        unsubscribe_url=_read(
            env,
            "DIGEST_UNSUBSCRIBE_URL",
            "https://shop.example/unsubscribe/{customer_id}?token={token}",
            _url_template,
        ),
        # The demo default is public; production sets its own, or links can be forged.
        unsubscribe_secret=_read(env, "DIGEST_UNSUBSCRIBE_SECRET", "demo-unsubscribe-secret", str),
        smtp=_smtp(env, required=mailer == "smtp"),
        provider=_provider(env, required=mailer == "http"),
        operators=frozenset(
            name.strip() for name in env.get("DIGEST_OPERATORS", "").split(",") if name.strip()
        ),
    )


def _url_template(raw: str) -> str:
    if not raw.startswith(("http://", "https://")) or "{token}" not in raw:
        raise ValueError("must be an http(s) URL holding {token} (and optionally {customer_id})")
    return raw
