"""`DIGEST_SES_*` and the standard AWS credential variables: what the Amazon SES mailer sends with.

Read only when `DIGEST_MAILER=ses`. The region is required (SES identities, quotas, the sandbox
and configuration sets are all per region); the endpoint and the configuration set are
optional. A bad value raises `InvalidSetting` with one line naming the variable, never a secret.
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from urllib.parse import urlsplit

from digest_pipeline.setting_values import InvalidSetting, read_value

#: AWS region names: `us-east-1`, `eu-central-2`, `ap-southeast-4`, `us-gov-west-1`, `cn-north-1`
_REGION = re.compile(r"[a-z]{2}(?:-[a-z]+){1,3}-[0-9]{1,2}")
#: SES configuration set names: ASCII letters, digits, `_` and `-`, at most 64
_CONFIGURATION_SET = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: the standard variables boto3 reads first in its credential chain
KEY_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
TOKEN_VARIABLE = "AWS_SESSION_TOKEN"


@dataclass(frozen=True)
class SesSettings:
    """Where and as whom the SES mailer sends; no credentials: boto3's default chain."""

    region: str
    #: `DIGEST_SES_ENDPOINT_URL`: a VPC endpoint or a test server instead of the regional one
    endpoint_url: str | None
    #: `DIGEST_SES_CONFIGURATION_SET`: names the event destination that publishes to SNS
    configuration_set: str | None
    #: `DIGEST_PROVIDER_TIMEOUT_SECONDS`: the connect and the read timeout
    timeout_seconds: float
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    #: set for temporary credentials (STS), whose key id changes with every rotation
    session_token: str | None = field(default=None, repr=False)


def _region(raw: str) -> str:
    if not _REGION.fullmatch(raw):
        raise ValueError("must be an AWS region name such as eu-west-1")
    return raw


def _endpoint_url(raw: str) -> str:
    try:
        parts = urlsplit(raw)
        port_ok = parts.port is None or parts.port > 0
    except ValueError:  # a bad port or an unbalanced IPv6 bracket
        parts, port_ok = None, False
    if (
        parts is None
        or not port_ok
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or "@" in parts.netloc
        or parts.query
        or parts.fragment
    ):
        raise ValueError(
            "must be an http:// or https:// URL with a host and no user, query or fragment"
        )
    return raw.rstrip("/")


def _configuration_set(raw: str) -> str:
    if not _CONFIGURATION_SET.fullmatch(raw):
        raise ValueError("must be 1-64 ASCII letters, digits, '_' or '-'")
    return raw


def read_ses(env: Mapping[str, str], timeout: timedelta) -> SesSettings:
    """The SES mailer's settings; `timeout` is `DIGEST_PROVIDER_TIMEOUT_SECONDS`, already read.

    Raises:
        InvalidSetting: a missing region, a malformed value, or one AWS key variable without
            the other; one line that never repeats a credential.
    """
    region = read_value(env, "DIGEST_SES_REGION", None, _region)
    if region is None:
        raise InvalidSetting(
            "DIGEST_SES_REGION is required when DIGEST_MAILER=ses (the region whose SES "
            "identities send, e.g. eu-west-1)"
        )
    key_id, secret = (env.get(name, "").strip() or None for name in KEY_VARIABLES)
    if (key_id is None) != (secret is None):
        raise InvalidSetting(
            f"{' and '.join(KEY_VARIABLES)}: set both or neither (neither: boto3's default "
            "credential chain)"
        )
    return SesSettings(
        region=region,
        # not repeated: a refused URL may hold a user and password
        endpoint_url=read_value(env, "DIGEST_SES_ENDPOINT_URL", None, _endpoint_url, shown=False),
        configuration_set=read_value(env, "DIGEST_SES_CONFIGURATION_SET", None, _configuration_set),
        timeout_seconds=timeout.total_seconds(),
        access_key_id=key_id,
        secret_access_key=secret,
        session_token=(env.get(TOKEN_VARIABLE, "").strip() or None) if key_id else None,
    )
