"""The one-click unsubscribe token (RFC 8058) and the rule that keeps the public demo secret demo-only.

The composer signs each customer's link with `unsubscribe_token` and `digest serve` checks it
with `token_matches` in constant time; both live here so the two can never drift apart. The
public default secret is fit only for `digest seed` data: `public_secret_refusal` says so, and a
secret shorter than `MIN_SECRET_BYTES` likewise (`short_secret_refusal`). `LinkSecrets` is what
`digest serve` checks a link against: the current secret, and the previous one during the overlap
a rotation grants (domain/fingerprints.py).
"""

import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

#: `DIGEST_UNSUBSCRIBE_SECRET`'s default: published in this repository, so anyone can forge a
#: link with it. Allowed only on a ledger that holds `digest seed` demo data.
DEMO_UNSUBSCRIBE_SECRET = "demo-unsubscribe-secret"
#: the shortest `DIGEST_UNSUBSCRIBE_SECRET` outside the demo: 128 bits, as much as a token holds
MIN_SECRET_BYTES = 16
#: hex digits of the HMAC kept in a link (128 bits: short enough for a URL, far beyond guessing)
TOKEN_LENGTH = 32


def unsubscribe_token(secret: str, customer_id: str) -> str:
    """The per-customer token of the one-click unsubscribe link: HMAC-SHA256, 32 hex digits."""
    return token_signer(secret)(customer_id)


def token_signer(secret: str) -> Callable[[str], str]:
    """`unsubscribe_token` with `secret` bound, keyed once: a composer signs every customer's link.

    Keying an HMAC hashes the key's two pads; a copy of the keyed state skips that per token.
    """
    keyed = hmac.new(secret.encode(), digestmod=hashlib.sha256)

    def sign(customer_id: str) -> str:
        mac = keyed.copy()
        mac.update(customer_id.encode())
        return mac.hexdigest()[:TOKEN_LENGTH]

    return sign


def token_matches(secret: str, customer_id: str, token: str) -> bool:
    """Whether `token` is `customer_id`'s token under `secret`, compared in constant time.

    Any text is accepted and compared as UTF-8 bytes (a lone surrogate becomes `?`), so a
    malformed token is simply a wrong one and its shape leaks nothing through timing.
    """
    expected = unsubscribe_token(secret, customer_id).encode()
    given = token.encode("utf-8", "replace")
    return hmac.compare_digest(expected, given)


def public_secret_refusal(
    secret: str, holds_demo_data: Callable[[], bool], *, what: str
) -> str | None:
    """Why `what` must not go on with `secret`, or None when it may.

    The public demo secret is refused unless the ledger holds `digest seed` demo data: on a
    real shop's ledger anyone could forge every customer's unsubscribe link with it.
    `holds_demo_data` (the ledger's question) is asked only for the public secret.
    """
    if secret != DEMO_UNSUBSCRIBE_SECRET or holds_demo_data():
        return None
    return (
        f"{what} refused: DIGEST_UNSUBSCRIBE_SECRET is the public demo value and this ledger "
        "holds no `digest seed` demo data; set DIGEST_UNSUBSCRIBE_SECRET to a private random value"
    )


def short_secret_refusal(
    secret: str, holds_demo_data: Callable[[], bool], *, what: str
) -> str | None:
    """Why `what` must not go on with a secret under `MIN_SECRET_BYTES` bytes, or None.

    A short secret can be guessed from one link (offline, by trying every value against the
    token), and then every customer's link forged. Only a demo ledger may use one.
    """
    size = len(secret.encode("utf-8", "surrogateescape"))
    if size >= MIN_SECRET_BYTES or holds_demo_data():
        return None
    return (
        f"{what} refused: DIGEST_UNSUBSCRIBE_SECRET is {size} bytes; use a private random value "
        f"of at least {MIN_SECRET_BYTES} bytes"
    )


@dataclass(frozen=True)
class LinkSecrets:
    """The secrets a link may be signed with: the current one, and the previous until a time."""

    current: str = field(repr=False)
    previous: str | None = field(default=None, repr=False)
    #: the end of the rotation's overlap; the previous secret is never accepted without it
    previous_until: datetime | None = None

    def secret_of(self, customer_id: str, token: str, now: datetime) -> str | None:
        """The secret that signed `token` for `customer_id` and is accepted at `now`, or None."""
        if token_matches(self.current, customer_id, token):
            return self.current
        open_ = self.previous_until is not None and now < self.previous_until
        if self.previous is not None and open_ and token_matches(self.previous, customer_id, token):
            return self.previous
        return None
