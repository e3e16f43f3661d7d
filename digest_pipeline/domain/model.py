"""Frozen records that cross the port boundary: snapshot entries, work items, attempts, messages.

They are plain values; the ledger adapters build them from rows and the fakes keep them in memory.
"""

import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from digest_pipeline.domain.errors import InvalidCustomerId
from digest_pipeline.domain.failures import FailureClass
from digest_pipeline.domain.periods import OperationKey, Period, validate_customer_id
from digest_pipeline.domain.states import DeliveryState


@dataclass(frozen=True)
class Customer:
    """A row of the shop's customer table, as the eligibility rule sees it."""

    customer_id: str
    email: str
    active: bool
    opted_in: bool


def is_eligible(customer: Customer) -> bool:
    """Active and opted in: the whole rule, kept here so every selector applies the same one."""
    return customer.active and customer.opted_in


#: The longest recipient address the snapshot selects: 64 characters of local part, '@' and 255
#: of domain (RFC 5321 §4.5.3.1, RFC 3696 errata 1690). A longer one can only be a data error,
#: and it would put a `To:` line past RFC 5322's 998 characters.
MAX_ADDRESS_LENGTH = 320


class Exclusion(StrEnum):
    """Why an eligible customer is left out of the snapshot: counted, never sent to, never fixed."""

    #: the id cannot form an operation key (`validate_customer_id`)
    INVALID_ID = "invalid_id"
    #: the address is longer than MAX_ADDRESS_LENGTH
    ADDRESS_TOO_LONG = "address_too_long"


def exclusion(customer: Customer) -> Exclusion | None:
    """Why an eligible customer cannot be selected, or None when it can."""
    try:
        validate_customer_id(customer.customer_id)
    except InvalidCustomerId:
        return Exclusion.INVALID_ID
    if len(customer.email) > MAX_ADDRESS_LENGTH:
        return Exclusion.ADDRESS_TOO_LONG
    return None


@dataclass(frozen=True)
class SnapshotEntry:
    """One selected customer, with the recipient address as it was at selection time."""

    customer_id: str
    recipient: str


@dataclass(frozen=True)
class SnapshotInfo:
    """The frozen selection of one period."""

    period: Period
    selection_run_id: str
    selected_at: datetime
    eligible_count: int
    #: sha256 over the sorted entries; invariant 5 recomputes it
    fingerprint: str
    enqueued_at: datetime | None = None


@dataclass(frozen=True)
class SnapshotReceipt:
    """What freezing did: created a new snapshot or reused the one frozen before."""

    info: SnapshotInfo
    reused: bool


def fingerprint_entry(entry: SnapshotEntry) -> int:
    """One entry's share of a snapshot fingerprint."""
    return fingerprint_share(entry.customer_id, entry.recipient)


def fingerprint_share(customer_id: str, recipient: str) -> int:
    """`fingerprint_entry` of a customer id and recipient read as they are (no entry built)."""
    h = hashlib.sha256(f"{customer_id}\x1f{recipient}".encode())
    return int.from_bytes(h.digest(), "big")


def snapshot_fingerprint(entries: Iterable[SnapshotEntry]) -> str:
    """A digest of a selection that ignores order, so it can be computed while streaming.

    It is the sum of per-entry sha256 values modulo 2**256 (a multiset hash): any added,
    removed or changed entry changes it, and no sort (or database collation) is involved.
    """
    total = sum(fingerprint_entry(e) for e in entries) % FINGERPRINT_MODULUS
    return format_fingerprint(total)


FINGERPRINT_MODULUS = 2**256


def format_fingerprint(total: int) -> str:
    """The stored form of a fingerprint sum: 64 hex digits."""
    return f"{total % FINGERPRINT_MODULUS:064x}"


@dataclass(frozen=True)
class WorkItem:
    """The durable record of one operation key (design §1)."""

    key: OperationKey
    state: DeliveryState
    created_at: datetime
    next_attempt_at: datetime | None
    #: every attempt ever started, never reset
    attempts: int = 0
    #: attempts counted against `max_attempts` since the item was last (re)opened
    budget_used: int = 0
    #: first attempt since the item was last (re)opened; `max_age` runs from here
    window_started_at: datetime | None = None
    first_attempt_at: datetime | None = None
    last_attempt_at: datetime | None = None
    last_failure_class: FailureClass | None = None
    last_detail: str | None = None
    lease_owner: str | None = None
    #: the fencing token: incremented by every claim, required by every transition
    lease_token: int = 0
    lease_expires_at: datetime | None = None
    first_claimed_at: datetime | None = None
    provider_message_id: str | None = None
    sent_at: datetime | None = None
    cleaned_at: datetime | None = None
    replayed_at: datetime | None = None
    #: set while a send may already have reached the provider and only its deduplication of the
    #: key makes a resend safe: no attempt may start after this instant
    dedupe_until: datetime | None = None

    @property
    def period(self) -> Period:
        return self.key.period

    @property
    def customer_id(self) -> str:
        return self.key.customer_id


@dataclass(frozen=True)
class ItemTimes:
    """The part of a work item a period's metrics read: its state and four of its times.

    A week's metrics pass over every item; reading these five columns instead of the whole row
    keeps that pass cheap at a hundred thousand items.
    """

    state: DeliveryState
    created_at: datetime
    first_claimed_at: datetime | None
    sent_at: datetime | None
    cleaned_at: datetime | None

    @classmethod
    def of(cls, item: WorkItem) -> "ItemTimes":
        return cls(
            item.state, item.created_at, item.first_claimed_at, item.sent_at, item.cleaned_at
        )


@dataclass(frozen=True)
class ItemLease:
    """The part of a work item cleanup reads: which item, its state and its fencing token."""

    key: OperationKey
    state: DeliveryState
    lease_token: int

    @classmethod
    def of(cls, item: WorkItem) -> "ItemLease":
        return cls(item.key, item.state, item.lease_token)


@dataclass(frozen=True)
class Claim:
    """A leased work item: the holder may act on it while the token still matches."""

    item: WorkItem
    token: int
    owner: str
    expires_at: datetime

    @property
    def key(self) -> OperationKey:
        return self.item.key


@dataclass(frozen=True)
class AttemptTicket:
    """An attempt recorded as started; closed by `Ledger.complete`."""

    attempt_id: int
    key: OperationKey
    number: int
    token: int
    started_at: datetime


@dataclass(frozen=True)
class Attempt:
    """One row of the append-only attempt history."""

    attempt_id: int
    key: OperationKey
    number: int
    token: int
    worker: str
    started_at: datetime
    finished_at: datetime | None
    #: `sent` or a failure class value; None while the attempt is open
    outcome: str | None
    detail: str | None
    provider_message_id: str | None
    duplicate: bool
    #: the identity of the mailer that made it (`domain.mailer_identity`); None: not recorded
    mailer: str | None = None


@dataclass(frozen=True)
class DeadLetterRecord:
    """A dead-letter row: identities, reason and counts; never an address or content."""

    dead_letter_id: int
    key: OperationKey
    reason: str
    last_failure_class: FailureClass | None
    attempts: int
    first_attempt_at: datetime | None
    last_attempt_at: datetime | None
    created_at: datetime
    replayed_at: datetime | None


@dataclass(frozen=True)
class AuditEntry:
    """An operator's (or the reconciler's) action, with who, why and what changed."""

    at: datetime
    actor: str
    action: str
    key: OperationKey | None
    from_state: DeliveryState | None
    to_state: DeliveryState | None
    reason: str
    period: Period | None = None
    audit_id: int = 0


@dataclass(frozen=True)
class DigestRow:
    """One generated content row of a customer's digest (a product pick), linked to its key."""

    key: OperationKey
    position: int
    payload: dict[str, object]


@dataclass(frozen=True)
class Message:
    """A rendered digest ready for a mailer. Its idempotency key is the operation key."""

    key: OperationKey
    recipient: str
    sender: str
    subject: str
    text: str
    html: str | None = None
    headers: tuple[tuple[str, str], ...] = field(default=())


def key_digest(key: OperationKey) -> str:
    """32 hex digits of the key's SHA-256: a name for one item's message that shows no customer id."""
    return hashlib.sha256(str(key).encode()).hexdigest()[:32]


def message_id_for(key: OperationKey, domain: str = "digest.invalid") -> str:
    """A `Message-ID` stable across retries, so receivers can spot a duplicate (RFC 5322 §3.6.4).

    Unkeyed, so anyone who knows the key can compute it: the simulator and the test fakes use it,
    and the product composer uses `keyed_message_id`.
    """
    return f"<{key_digest(key)}@{domain}>"


def keyed_message_id(key: OperationKey, id_key: bytes, domain: str) -> str:
    """A `Message-ID` stable across retries of `key` that only the holder of `id_key` can name.

    32 hex digits of HMAC-SHA256 over the key: another install, or anyone who knows a customer
    id, cannot compute it, and it shows neither the customer id nor `key_digest(key)`.
    """
    digest = hmac.new(id_key, str(key).encode(), hashlib.sha256).hexdigest()[:32]
    return f"<{digest}@{domain}>"


class LookupStatus(StrEnum):
    """What a mailer can say about an idempotency key it was asked about."""

    #: the provider accepted a message with this key
    FOUND = "found"
    #: the provider has no message with this key
    NOT_FOUND = "not_found"
    #: the mailer cannot look keys up
    UNSUPPORTED = "unsupported"


@dataclass(frozen=True)
class LookupResult:
    status: LookupStatus
    provider_message_id: str | None = None


@dataclass(frozen=True)
class MailerCapabilities:
    """What reconciliation may rely on (design §2)."""

    #: how long the provider deduplicates a repeated idempotency key; None when it does not
    idempotency_window: timedelta | None
    #: whether `lookup` can tell whether a key was accepted
    can_lookup: bool
    #: whether a send waits on a peer across a network; a local one (a file, memory) returns
    #: faster than the ledger records, so a worker's waves need not overlap (domain/waves.py)
    remote: bool = True
    #: how long after accepting a message the provider's `lookup` may still not find it: a
    #: "not found" about an attempt younger than this is no evidence (the item stays `unknown`)
    lookup_lag: timedelta = timedelta(0)


class CleanupMode(StrEnum):
    """What cleanup does with an item's generated rows (`DIGEST_CLEANUP_MODE`)."""

    #: copy them to the archive table, then delete them
    ARCHIVE = "archive"
    #: delete them
    DELETE = "delete"


@dataclass(frozen=True)
class AuditNote:
    """Who moved an item and why; written in the same transaction as the move."""

    actor: str
    action: str
    reason: str


@dataclass(frozen=True)
class RefundBudget:
    """A throttled attempt gives back the budget unit its start took."""


@dataclass(frozen=True)
class Reopen:
    """Replay: reset the retry budget and age window, stamp `replayed_at`, clear `dedupe_until`."""


@dataclass(frozen=True)
class ResendUntil:
    """A resend relies on the provider's deduplication of the key until `until`."""

    until: datetime


@dataclass(frozen=True)
class ClearDedupe:
    """Evidence says nothing was delivered: the next send needs no deduplication."""


@dataclass(frozen=True)
class WriteDeadLetter:
    """Write a dead-letter row with `reason` in the same transaction as the move."""

    reason: str


#: What a move does beyond setting the state and the outcome's columns. A transition carries a
#: tuple of them because two can hold at once: a throttled attempt that ran out of age both
#: gives its budget unit back and is dead-lettered.
Effect = RefundBudget | Reopen | ResendUntil | ClearDedupe | WriteDeadLetter


@dataclass(frozen=True)
class Transition:
    """A guarded move of one item: applied only if the item is still `expected` with `token`.

    `domain.transitions.apply` says what it does to the item; each ledger stores that.
    """

    key: OperationKey
    expected: DeliveryState
    token: int
    target: DeliveryState
    at: datetime
    next_attempt_at: datetime | None = None
    failure_class: FailureClass | None = None
    detail: str | None = None
    provider_message_id: str | None = None
    audit: AuditNote | None = None
    effects: tuple[Effect, ...] = ()

    def has(self, effect: type[Effect]) -> bool:
        """Whether one of the effects is of type `effect`."""
        return any(isinstance(e, effect) for e in self.effects)

    @property
    def dead_letter_reason(self) -> str | None:
        """The reason of the dead-letter row this move writes, if it writes one."""
        return next((e.reason for e in self.effects if isinstance(e, WriteDeadLetter)), None)

    @property
    def resend_until(self) -> datetime | None:
        """Until when a resend may rely on the provider's deduplication, if this move sets it."""
        return next((e.until for e in self.effects if isinstance(e, ResendUntil)), None)

    def audit_entry(self) -> AuditEntry | None:
        """The audit row this move writes (its note, the key and both states), if it has a note."""
        if self.audit is None:
            return None
        a = self.audit
        return AuditEntry(
            self.at,
            a.actor,
            a.action,
            self.key,
            self.expected,
            self.target,
            a.reason,
            self.key.period,
        )


@dataclass(frozen=True)
class EnqueueReceipt:
    created: int
    existing: int


@dataclass(frozen=True)
class CleanupReceipt:
    """`cleaned` with the rows it archived or deleted, or `already_cleaned` with 0."""

    key: OperationKey
    status: str
    rows: int


@dataclass(frozen=True)
class LeaseRecovery:
    """Expired claims: back to due when no attempt started, `unknown` when one was open."""

    requeued: tuple[OperationKey, ...]
    unknown: tuple[OperationKey, ...]


#: design §4's invariants, in order, by the names every ledger reports them under
INVARIANTS = (
    "at_most_one_cleanup_per_key",
    "no_silent_timeout",
    "every_customer_has_visible_state",
    "no_duplicate_send",
    "snapshot_unchanged",
)


@dataclass(frozen=True)
class InvariantResult:
    """One design §4 invariant for one period: pass/fail and the offending keys (a sample)."""

    name: str
    passed: bool
    violations: int
    sample: tuple[str, ...] = ()
