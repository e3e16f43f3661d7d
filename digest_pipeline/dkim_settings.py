"""The sender address and the DKIM key that signs for its domain (`DIGEST_DKIM_*`).

A key is checked when the settings are read: all three variables or none, a readable PEM RSA
(1024 bits or more, RFC 8301 §3.2) or Ed25519 key no larger than `MAX_KEY_BYTES`, and a signing
domain that is the sender's or a parent of it, so DMARC's relaxed alignment holds (RFC 7489
§3.1.1). A bad value raises ValueError naming the variable; settings.py turns it into
`InvalidSetting`.
"""

import base64
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from email.policy import SMTP
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

from digest_pipeline.setting_values import read_small_file

#: a 4096-bit RSA key in PEM is about 3.3 KiB; anything far larger is not a key
MAX_KEY_BYTES = 64 * 1024
#: RFC 8301 §3.2: signers must use RSA keys of at least 1024 bits
MIN_RSA_BITS = 1024
VARIABLES = ("DIGEST_DKIM_KEY_FILE", "DIGEST_DKIM_SELECTOR", "DIGEST_DKIM_DOMAIN")
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
#: RFC 6376 §3.1: a selector is one or more dot-separated labels
_SELECTOR = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
#: two labels or more: a bare top-level domain cannot be an organisational domain
_DOMAIN = re.compile(rf"{_LABEL}(?:\.{_LABEL})+")


@dataclass(frozen=True)
class DkimSettings:
    """What the SMTP mailer signs with: `selector._domainkey.domain` publishes the public key."""

    selector: str
    domain: str
    #: dkimpy's `signature_algorithm`: b"rsa-sha256" or b"ed25519-sha256"
    algorithm: bytes
    #: in the form dkimpy takes: PKCS#1 PEM for RSA, the base64 seed for Ed25519
    private_key: bytes = field(repr=False)


def sender_address(raw: str) -> str:
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


def _sender_domain(sender: str) -> str:
    return str(SMTP.header_factory("From", sender).addresses[0].domain).lower().rstrip(".")


def read_dkim(env: Mapping[str, str], sender: str) -> DkimSettings | None:
    """The DKIM settings for `sender` (already a valid address), or None when none is set.

    Raises:
        ValueError: one line naming the variable at fault, never the key's content.
    """
    path, selector, domain = (env.get(name, "").strip() for name in VARIABLES)
    if not (path or selector or domain):
        return None
    own = _sender_domain(sender)
    domain = domain.lower().rstrip(".") or own
    missing = [
        name for name, value in zip(VARIABLES[:2], (path, selector), strict=True) if not value
    ]
    if missing:
        raise ValueError(f"{' and '.join(missing)} required: set all DIGEST_DKIM_* or none")
    if not _SELECTOR.fullmatch(selector):
        raise ValueError(f"DIGEST_DKIM_SELECTOR={selector!r}: must be DNS labels, e.g. digest2026")
    if not _DOMAIN.fullmatch(domain) or not (own == domain or own.endswith("." + domain)):
        raise ValueError(
            f"DIGEST_DKIM_DOMAIN={domain!r}: must be the sender's domain {own!r} or a parent of it"
            " (DMARC alignment)"
        )
    algorithm, key = _key(Path(path))
    return DkimSettings(selector=selector, domain=domain, algorithm=algorithm, private_key=key)


def _key(path: Path) -> tuple[bytes, bytes]:
    name = f"DIGEST_DKIM_KEY_FILE={str(path)!r}"
    pem = read_small_file(path, name, MAX_KEY_BYTES, "a key", error=ValueError)
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as e:
        # TypeError: the key is encrypted; the mailer has no passphrase to open it with
        raise ValueError(f"{name}: not an unencrypted PEM private key") from e
    if isinstance(key, rsa.RSAPrivateKey):
        if key.key_size < MIN_RSA_BITS:
            raise ValueError(f"{name}: an RSA key needs {MIN_RSA_BITS} bits or more")
        pkcs1 = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
        return b"rsa-sha256", pkcs1
    if isinstance(key, ed25519.Ed25519PrivateKey):
        seed = key.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        return b"ed25519-sha256", base64.b64encode(seed)
    raise ValueError(f"{name}: must be an RSA or Ed25519 key")
