"""Which mailer made an attempt: its kind and a non-secret digest of its endpoint or account.

Evidence about an attempt (a lookup, a resend the provider deduplicates) is worth something only
from the mailer that made it: an outbox's "not found" says nothing about what an SMTP relay
stored. Each attempt records its mailer's identity, and evidence from any other mailer is not
asked for; an attempt recorded before identities were kept counts as made by another mailer.
"""

import hashlib
from collections.abc import Iterable, Sequence

from digest_pipeline.domain.model import Attempt
from digest_pipeline.domain.possible_sends import uncertain_attempt

#: what stands for an attempt whose mailer was not recorded
UNRECORDED = "unrecorded"
#: the separator of an identity's endpoint parts: never part of a host, URL, path or user name
_SEPARATOR = "\x1f"


def mailer_identity(kind: str, *endpoint: str) -> str:
    """`kind:` and 16 hex digits of SHA-256 over the endpoint's parts (never a secret itself).

    A part that is a credential goes in only as its own digest (`fingerprint`), so the identity
    in the ledger and in messages tells mailers apart without revealing what they log in with.
    """
    digest = hashlib.sha256(_SEPARATOR.join(endpoint).encode("utf-8")).hexdigest()[:16]
    return f"{kind}:{digest}"


def fingerprint(secret: str) -> str:
    """A one-way digest of a credential, to stand for it among an identity's endpoint parts."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def foreign_mailers(history: Iterable[Attempt], mailer: str) -> tuple[str, ...]:
    """The other mailers (sorted) that made any attempt of `history` that may have delivered.

    Those attempts are the ones a lookup or an idempotent resend would settle; when one was made
    through another mailer, only that mailer (or an operator) can settle it.
    """
    return tuple(
        sorted(
            {a.mailer or UNRECORDED for a in history if uncertain_attempt(a) and a.mailer != mailer}
        )
    )


def describe_needed(needed: Sequence[str]) -> str:
    """The mailers an item needs, as one line's words: `smtp:… or http:…`."""
    return " or ".join(needed)
