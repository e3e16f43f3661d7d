"""Keyed fingerprints of the secrets that sign what customers hold, so every process can tell it has the same one.

The ledger keeps `fingerprint(secret)`, never the secret: HMAC-SHA512 keyed with the secret over a
fixed per-purpose label, cut to 256 bits in hex. Tokens are HMAC-SHA256, so a fingerprint is never
a token, and it tells a guesser no more than any one link does. One record per purpose holds the
current fingerprint and, after a rotation, the previous one with the end of its overlap.
"""

import hashlib
import hmac
from dataclasses import dataclass
from datetime import datetime, timedelta

from digest_pipeline.domain.model import AuditEntry

#: the purpose of the unsubscribe links' secret (`DIGEST_UNSUBSCRIBE_SECRET`)
UNSUBSCRIBE = "unsubscribe"
#: the message each purpose's fingerprint is the HMAC of, so fingerprints differ per purpose
LABELS = {UNSUBSCRIBE: b"digest-unsubscribe-fingerprint"}
#: hex digits of a fingerprint: the first 256 bits of the HMAC-SHA512
FINGERPRINT_LENGTH = 64
#: hex digits shown in error lines and audit rows: enough to tell two secrets apart by eye
SHOWN = 12
#: how long links signed with the previous secret stay valid after a rotation, by default: a
#: customer opens last month's digest; eight weekly digests are the ones a reader still has
DEFAULT_OVERLAP = timedelta(weeks=8)
#: the longest overlap `digest rotate-secret` accepts: a retired secret must stop signing
MAX_OVERLAP_WEEKS = 52
#: the audit action of a rotation
ROTATE_ACTION = "rotate_secret"


def fingerprint(secret: str, purpose: str = UNSUBSCRIBE) -> str:
    """HMAC-SHA512 keyed with `secret` over `purpose`'s label: its first 64 hex digits.

    Not SHA-256: a token is the HMAC-SHA256 of a customer id, and the label could be one.
    """
    mac = hmac.new(secret.encode(), LABELS[purpose], hashlib.sha512)
    return mac.hexdigest()[:FINGERPRINT_LENGTH]


def shown(fp: str | None) -> str:
    """The first `SHOWN` hex digits of a fingerprint, or `none`."""
    return "none" if fp is None else fp[:SHOWN]


@dataclass(frozen=True)
class FingerprintRecord:
    """What the ledger records about one purpose's secret."""

    purpose: str
    #: the fingerprint of the secret that signs now
    current: str
    #: when `current` was recorded (first use or rotation)
    recorded_at: datetime
    #: the fingerprint of the secret `current` replaced, accepted until `previous_until`
    previous: str | None = None
    previous_until: datetime | None = None

    def previous_open(self, now: datetime) -> bool:
        """Whether links signed with the previous secret are still accepted at `now`."""
        return self.previous_until is not None and now < self.previous_until


def rotation_audit(
    before: FingerprintRecord | None, after: FingerprintRecord, actor: str, reason: str
) -> AuditEntry:
    """The audit row of a rotation: who, why, and the fingerprints (never the secrets)."""
    until = "" if after.previous_until is None else after.previous_until.isoformat()
    kept = f"previous accepted until {until}" if until else "previous not accepted"
    what = (
        f"{after.purpose} secret {shown(None if before is None else before.current)} -> "
        f"{shown(after.current)}; {kept}"
    )
    return AuditEntry(
        at=after.recorded_at,
        actor=actor,
        action=ROTATE_ACTION,
        key=None,
        from_state=None,
        to_state=None,
        reason=f"{reason} [{what}]",
    )
