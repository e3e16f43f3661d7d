"""Which unsubscribe secret a process may sign or check links with, and its one audited change.

A process that signs links (`digest run`, `digest sweep`, a Dagster delivery step) or checks them
(`digest serve`) asks `start_refusal` first: the public demo secret and a secret under 16 bytes
are refused outside a demo ledger, and so are a link mailbox providers cannot reach and a
missing postal address (domain/compliance.py); then the first process on a ledger records its
secret's keyed fingerprint (domain/fingerprints.py), so every later one with another secret is
refused instead of sending links that `digest serve` answers with 403.

The recorded secret changes only through `rotate_secret` (`digest rotate-secret`), and these are
its decisions:
* the new secret comes from `DIGEST_UNSUBSCRIBE_SECRET`, never the command line (argv is
  visible to every user of the machine and kept in shell histories);
* the replaced secret comes from `DIGEST_UNSUBSCRIBE_SECRET_PREVIOUS` and must match the
  recorded fingerprint: only who holds it can keep links it signed valid. Its fingerprint stays
  accepted for a bounded overlap (8 weeks by default, at most 52), so digests already sent keep
  working; `digest serve` verifies with it only while the overlap is open;
* an overlap of 0 needs no previous secret: for a leaked or lost secret, every link already
  sent stops working at once;
* one previous secret at most: rotating again during an overlap ends the older one's;
* a rotation is a compare-and-set on the recorded fingerprint, with its audit row (who, why,
  the fingerprints' first digits) in the same transaction.
"""

import functools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from digest_pipeline.domain.compliance import Compliance, compliance_refusal
from digest_pipeline.domain.errors import DigestError
from digest_pipeline.domain.fingerprints import (
    UNSUBSCRIBE,
    FingerprintRecord,
    fingerprint,
    rotation_audit,
    shown,
)
from digest_pipeline.domain.unsubscribe import (
    LinkSecrets,
    public_secret_refusal,
    short_secret_refusal,
)
from digest_pipeline.ports.ledger_roles import HasSecretFingerprints, SnapshotStore

SECRET = "DIGEST_UNSUBSCRIBE_SECRET"
PREVIOUS = "DIGEST_UNSUBSCRIBE_SECRET_PREVIOUS"


class SecretLedger(SnapshotStore, HasSecretFingerprints, Protocol):
    """Whether the ledger holds demo data, and the fingerprints of the secrets it signs with."""


class SecretRefused(DigestError):
    """A secret (or the link and address it goes with) was refused; the message is the one line."""


def _when(t: datetime | None) -> str:
    return "-" if t is None else t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _strength_refusal(secret: str, demo: Callable[[], bool], what: str) -> str | None:
    return public_secret_refusal(secret, demo, what=what) or short_secret_refusal(
        secret, demo, what=what
    )


def start_refusal(
    ledger: SecretLedger, secret: str, compliance: Compliance | None, now: datetime, *, what: str
) -> str | None:
    """The first reason `what` must not start on `ledger`, or None when it may.

    In order: the secret's strength, the unsubscribe link and postal address (`compliance`;
    None for a composer that renders neither, a test's fake), then the secret's fingerprint.
    Each refusal is one line naming its variable; a first fingerprint is recorded only when
    nothing before it refused, so a refused start changes nothing recorded.
    """
    # asked at most once, and only when a setting needs the demo's leave
    demo = functools.cache(ledger.holds_demo_data)
    refusal = _strength_refusal(secret, demo, what)
    if refusal is None and compliance is not None:
        refusal = compliance_refusal(compliance, demo, what=what)
    return refusal or _fingerprint_refusal(ledger, secret, now, what)


def secret_refusal(ledger: SecretLedger, secret: str, now: datetime, *, what: str) -> str | None:
    """Why `what` must not sign or check links with `secret` on `ledger`, or None when it may.

    When it may, the secret's fingerprint is the recorded one: recorded now if the ledger had
    none (the first process that signs or checks links on it). A process that starts sending
    or serving asks `start_refusal`, which checks the link and the postal address too.
    """
    return start_refusal(ledger, secret, None, now, what=what)


def _fingerprint_refusal(ledger: SecretLedger, secret: str, now: datetime, what: str) -> str | None:
    mine = fingerprint(secret)
    record = ledger.secret_fingerprints.record_first_fingerprint(UNSUBSCRIBE, mine, now)
    if record.current == mine:
        return None
    if record.previous == mine:
        return (
            f"{what} refused: {SECRET} is the secret rotated out at "
            f"{_when(record.recorded_at)}; set it to the current one (fingerprint "
            f"{shown(record.current)})"
        )
    return (
        f"{what} refused: {SECRET} is not the secret this ledger's links are signed with "
        f"(fingerprint {shown(mine)}, recorded {shown(record.current)}); set the recorded "
        "one, or change it with digest rotate-secret"
    )


def require_secret(ledger: SecretLedger, secret: str, now: datetime, *, what: str) -> None:
    """`secret_refusal`, raised as SecretRefused."""
    refusal = secret_refusal(ledger, secret, now, what=what)
    if refusal is not None:
        raise SecretRefused(refusal)


def serve_secrets(
    ledger: SecretLedger,
    secret: str,
    previous: str | None,
    now: datetime,
    *,
    compliance: Compliance | None,
) -> LinkSecrets:
    """The secrets `digest serve` checks links with; SecretRefused when it must not start.

    `start_refusal` first, with the link and address the digests carry (`compliance`). During a
    rotation's overlap the previous secret is required, or every link in the digests sent
    before the rotation would get 403; one that is not the rotated-out secret is refused.
    """
    what = "digest serve"
    refusal = start_refusal(ledger, secret, compliance, now, what=what)
    if refusal is not None:
        raise SecretRefused(refusal)
    record = ledger.secret_fingerprints.fingerprint_record(UNSUBSCRIBE)
    if record is None:  # pragma: no cover - require_secret has just recorded it
        raise SecretRefused(f"{what} refused: no {UNSUBSCRIBE} secret is recorded")
    if previous is None:
        if record.previous_open(now):
            raise SecretRefused(
                f"{what} refused: links signed before the rotation at "
                f"{_when(record.recorded_at)} stay valid until {_when(record.previous_until)}; "
                f"set {PREVIOUS} to the secret rotated out"
            )
        return LinkSecrets(secret)
    if record.previous is None or fingerprint(previous) != record.previous:
        raise SecretRefused(
            f"{what} refused: {PREVIOUS} is not the secret this ledger rotated out "
            f"(fingerprint {shown(fingerprint(previous))}, recorded {shown(record.previous)}); "
            "unset it or set the rotated-out one"
        )
    return LinkSecrets(secret, previous, record.previous_until)


@dataclass(frozen=True)
class Rotation:
    """What a rotation recorded: the record before (None on a first record) and after."""

    before: FingerprintRecord | None
    after: FingerprintRecord


def rotate_secret(
    ledger: SecretLedger,
    new: str,
    previous: str | None,
    overlap: timedelta,
    now: datetime,
    *,
    actor: str,
    reason: str,
) -> Rotation:
    """Records `new` as the secret that signs links, keeping `previous` accepted for `overlap`.

    Raises SecretRefused (nothing written) for an empty reason, a weak or unchanged new
    secret, a previous secret that is not the recorded one, an overlap without a previous
    secret, or a concurrent rotation.
    """
    what = "digest rotate-secret"
    if not reason.strip():
        raise SecretRefused(f"{what} refused: --reason must say why the secret changes")
    refusal = _strength_refusal(new, functools.cache(ledger.holds_demo_data), what)
    if refusal is not None:
        raise SecretRefused(refusal)
    if previous is not None and previous == new:
        raise SecretRefused(f"{what} refused: {PREVIOUS} is the same as {SECRET}")
    fps = ledger.secret_fingerprints
    before = fps.fingerprint_record(UNSUBSCRIBE)
    new_fp = fingerprint(new)
    if before is not None and before.current == new_fp:
        raise SecretRefused(
            f"{what} refused: {SECRET} is already the recorded secret; set it to the new one"
        )
    old_fp = None if previous is None else fingerprint(previous)
    if before is not None and old_fp is not None and old_fp != before.current:
        raise SecretRefused(
            f"{what} refused: {PREVIOUS} is not the secret this ledger's links are signed with "
            f"(fingerprint {shown(old_fp)}, recorded {shown(before.current)})"
        )
    if overlap > timedelta(0) and old_fp is None:
        raise SecretRefused(
            f"{what} refused: set {PREVIOUS} to the secret being replaced, so links already "
            "sent keep working, or pass --overlap-weeks 0 to end them now"
        )
    keep = overlap > timedelta(0)
    after = FingerprintRecord(
        UNSUBSCRIBE,
        new_fp,
        now,
        previous=old_fp if keep else None,
        previous_until=now + overlap if keep else None,
    )
    expected = None if before is None else before.current
    if not fps.rotate_fingerprint(after, expected, rotation_audit(before, after, actor, reason)):
        raise SecretRefused(
            f"{what} refused: another process changed the recorded secret meanwhile; run it again"
        )
    return Rotation(before, after)
