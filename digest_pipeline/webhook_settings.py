"""The providers whose signed webhooks `digest serve` accepts, and their keys (`DIGEST_WEBHOOK_SECRETS`).

Each entry is checked when the settings are read: a provider name fit for a URL segment and a
column, and a key long enough not to be guessed (domain/webhooks.py). A bad entry raises
ValueError naming the variable, the entry's position and its provider, never its secret;
settings.py turns it into `InvalidSetting`.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field

from digest_pipeline.domain.webhooks import PROVIDER_NAME, InvalidWebhookSecret, parse_secret


@dataclass(frozen=True)
class WebhookSecret:
    """One provider's webhook signing key (`DIGEST_WEBHOOK_SECRETS`); a provider may have two."""

    provider: str
    key: bytes = field(repr=False)


def read_webhook_secrets(env: Mapping[str, str]) -> tuple[WebhookSecret, ...]:
    """`DIGEST_WEBHOOK_SECRETS`: comma-separated `provider=secret` entries.

    A secret is Svix's `whsec_<base64>` or any other text of at least 16 bytes; a provider may
    be named twice (old and new key during a rotation). A refusal names the entry by position
    and provider, never by its secret.
    """
    found: list[WebhookSecret] = []
    for n, entry in enumerate(env.get("DIGEST_WEBHOOK_SECRETS", "").split(","), start=1):
        if not entry.strip():
            continue
        provider, sep, secret = (part.strip() for part in entry.partition("="))
        if not sep or not PROVIDER_NAME.fullmatch(provider):
            raise ValueError(
                f"DIGEST_WEBHOOK_SECRETS entry {n}: use PROVIDER=SECRET with a provider name of "
                "lower-case letters, digits, '_' or '-' (e.g. resend=whsec_...)"
            )
        try:
            found.append(WebhookSecret(provider, parse_secret(secret)))
        except InvalidWebhookSecret as e:
            raise ValueError(f"DIGEST_WEBHOOK_SECRETS entry {n} ({provider}): {e}") from e
    return tuple(found)
