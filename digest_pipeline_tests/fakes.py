"""Hand-written fakes of the ports (style §5, "Fakes, not mocks").

State goes in through the constructors and tests inspect through read-only properties. The
`FakeLedger` enforces what the SQL ledger enforces: one work item per operation key, one cleanup
per key, and every state change as a compare-and-set on (key, expected state, lease token). The
contract suite runs the same tests over it and the SQL ledger, so its semantics are the contract:

* every public method holds one `threading.Lock` for its whole duration, and computes every new
  record before it mutates anything, so a raised error leaves the ledger unchanged (a SQL
  transaction that rolled back);
* `complete` is the one exception by design: the attempt is closed even if the transition then
  loses its race, because the closed attempt is evidence for reconciliation.

`FakeMailer` simulates a provider: it keeps its own record of deliveries, deduplicates
idempotency keys inside a window, and can be scripted per key, including the two faults that
matter most here: a timeout after the provider accepted, and a worker crash right after it.
"""

import enum
import threading
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import ClassVar

from digest_pipeline.domain import transitions
from digest_pipeline.domain.catalogue import Order, Product
from digest_pipeline.domain.errors import (
    DigestError,
    LostRace,
    RenderError,
    SnapshotMissing,
    UnknownWorkItem,
)
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.feedback import (
    SOURCE_LENGTH,
    EventType,
    FeedbackCounts,
    Suppression,
    SuppressionReason,
    suppression_audit,
    unsubscribe_window,
    unsuppression_audit,
)
from digest_pipeline.domain.fingerprints import FingerprintRecord
from digest_pipeline.domain.model import (
    Attempt,
    AttemptTicket,
    AuditEntry,
    Claim,
    CleanupMode,
    CleanupReceipt,
    Customer,
    DeadLetterRecord,
    DigestRow,
    EnqueueReceipt,
    InvariantResult,
    LeaseRecovery,
    LookupResult,
    LookupStatus,
    MailerCapabilities,
    Message,
    Reopen,
    SnapshotEntry,
    SnapshotInfo,
    SnapshotReceipt,
    Transition,
    WorkItem,
    message_id_for,
    snapshot_fingerprint,
)
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.possible_sends import possible_send_count
from digest_pipeline.domain.regeneration import REGENERABLE, RowReplacement
from digest_pipeline.domain.states import (
    TERMINAL,
    DeliveryState,
    check_transition,
)
from digest_pipeline.domain.transitions import is_due
from digest_pipeline.ports import (
    AuditTrail,
    Clock,
    Composer,
    CustomerSource,
    FeedbackStore,
    Ledger,
    Mailer,
    SecretFingerprints,
)

_SAMPLE_SIZE = 10
_RECONCILING_ACTIONS = frozenset({"reconcile", "resolve"})


def _require_utc(t: datetime, what: str) -> datetime:
    if t.tzinfo is None or t.utcoffset() != timedelta(0):
        raise ValueError(f"{what} must be timezone-aware UTC, got {t!r}")
    return t


# -- clock -------------------------------------------------------------------------------------


class FixedClock(Clock):
    """A clock that moves only when the test says so."""

    def __init__(self, start: datetime) -> None:
        self._now = _require_utc(start, "start")
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, delta: timedelta) -> datetime:
        """Moves time forward by `delta` (never backwards: use `set` for that); returns now."""
        if delta < timedelta(0):
            raise ValueError(f"a clock only advances; got {delta}")
        with self._lock:
            self._now = self._now + delta
            return self._now

    def set(self, t: datetime) -> None:
        """Jumps to `t` (timezone-aware UTC)."""
        _require_utc(t, "t")
        with self._lock:
            self._now = t


# -- mailer ------------------------------------------------------------------------------------


class WorkerCrash(BaseException):
    """The worker process died (here: right after the provider accepted a message).

    A `BaseException`, so the services' ordinary `except Exception` cannot swallow it: the test
    catches it where the process would have died and then checks what a restart does.
    """


class ScriptedFault(enum.Enum):
    """Scripted provider behaviours that are more than a returned outcome."""

    #: the provider accepts (and delivers), but the caller sees a timeout (`unknown`)
    ACCEPTED_THEN_TIMEOUT = "accepted_then_timeout"
    #: the provider accepts (and delivers), then the worker process dies (`WorkerCrash`)
    CRASH_AFTER_ACCEPT = "crash_after_accept"


Scripted = SendOutcome | ScriptedFault

#: What the caller sees after `ACCEPTED_THEN_TIMEOUT`.
TIMEOUT_AFTER_SEND = SendOutcome.failed(FailureClass.UNKNOWN, "timeout_after_send")


@dataclass(frozen=True)
class Delivery:
    """One message the simulated provider actually delivered."""

    idempotency_key: str
    provider_message_id: str
    message: Message
    #: when it was delivered (None when the mailer has no clock)
    at: datetime | None


class FakeMailer(Mailer):
    """A provider simulation: deliveries, idempotency window, lookup and scripted faults.

    Every send of a key takes the next scripted behaviour of that key, if any:

    * a scripted `SendOutcome` is returned as-is and the provider records nothing (script a
      failure this way; to have a send really accepted, let the key's queue run out);
    * `ACCEPTED_THEN_TIMEOUT`: the provider processes the send as accepted (deduplicating as
      below), and the caller gets `unknown` / `timeout_after_send`;
    * `CRASH_AFTER_ACCEPT`: the same, then `WorkerCrash` is raised.

    An accepted send of a key already delivered is suppressed by an idempotent provider if the
    last delivery is inside the window (always, when no clock or no window is given): nothing is
    delivered and the caller gets `sent(<same id>, duplicate=True)`. A non-idempotent provider
    delivers every accepted send.
    """

    ACCEPTED_THEN_TIMEOUT: ClassVar[ScriptedFault] = ScriptedFault.ACCEPTED_THEN_TIMEOUT
    CRASH_AFTER_ACCEPT: ClassVar[ScriptedFault] = ScriptedFault.CRASH_AFTER_ACCEPT
    #: `remote` when a test does not say: a provider's round trip (sends on a pool), or, set by
    #: the `both_mailer_kinds` fixture, a local call (ledger calls overlapped with composing)
    remote_default: ClassVar[bool] = True

    def __init__(
        self,
        *,
        idempotent: bool = True,
        idempotency_window: timedelta | None = timedelta(hours=24),
        can_lookup: bool = True,
        clock: Clock | None = None,
        remote: bool | None = None,
    ) -> None:
        if idempotency_window is not None and idempotency_window <= timedelta(0):
            raise ValueError("idempotency_window must be positive")
        self._idempotent = idempotent
        self._window = idempotency_window
        self._can_lookup = can_lookup
        self._clock = clock
        self._remote = FakeMailer.remote_default if remote is None else remote
        self._lock = threading.Lock()
        self._scripts: dict[str, list[Scripted]] = {}
        self._deliveries: list[Delivery] = []
        self._last_delivery: dict[str, Delivery] = {}
        self._sends: Counter[str] = Counter()
        self._suppressed = 0
        self._next_id = 0

    # -- arranging -----------------------------------------------------------------------
    def script(self, key: str | OperationKey, *outcomes: Scripted) -> None:
        """Queues behaviours for the next sends of `key`; afterwards its sends succeed."""
        with self._lock:
            self._scripts.setdefault(str(key), []).extend(outcomes)

    def script_timeout_after_accept(self, key: str | OperationKey) -> None:
        self.script(key, ScriptedFault.ACCEPTED_THEN_TIMEOUT)

    def script_crash_after_accept(self, key: str | OperationKey) -> None:
        self.script(key, ScriptedFault.CRASH_AFTER_ACCEPT)

    # -- the port --------------------------------------------------------------------------
    @property
    def capabilities(self) -> MailerCapabilities:
        return MailerCapabilities(
            self._window if self._idempotent else None, self._can_lookup, self._remote
        )

    def send(self, message: Message, *, idempotency_key: str) -> SendOutcome:
        if idempotency_key != str(message.key):
            raise AssertionError(
                f"idempotency key {idempotency_key!r} is not the message's operation key"
                f" {str(message.key)!r}"
            )
        with self._lock:
            self._sends[idempotency_key] += 1
            queue = self._scripts.get(idempotency_key)
            scripted = queue.pop(0) if queue else None
            if isinstance(scripted, SendOutcome):
                return scripted
            accepted = self._accept_locked(message, idempotency_key)
        if scripted is ScriptedFault.ACCEPTED_THEN_TIMEOUT:
            return TIMEOUT_AFTER_SEND
        if scripted is ScriptedFault.CRASH_AFTER_ACCEPT:
            raise WorkerCrash(f"worker died after the provider accepted {idempotency_key}")
        return accepted

    def lookup(self, idempotency_key: str) -> LookupResult:
        if not self._can_lookup:
            return LookupResult(LookupStatus.UNSUPPORTED)
        with self._lock:
            last = self._last_delivery.get(idempotency_key)
        if last is None:
            return LookupResult(LookupStatus.NOT_FOUND)
        return LookupResult(LookupStatus.FOUND, last.provider_message_id)

    def _accept_locked(self, message: Message, key: str) -> SendOutcome:
        now = self._clock.now() if self._clock is not None else None
        last = self._last_delivery.get(key)
        if last is not None and self._idempotent and self._inside_window(last, now):
            self._suppressed += 1
            return SendOutcome.sent(last.provider_message_id, duplicate=True)
        self._next_id += 1
        delivery = Delivery(key, f"msg-{self._next_id}", message, now)
        self._deliveries.append(delivery)
        self._last_delivery[key] = delivery
        return SendOutcome.sent(delivery.provider_message_id)

    def _inside_window(self, last: Delivery, now: datetime | None) -> bool:
        if self._window is None or now is None or last.at is None:
            return True
        return now < last.at + self._window

    # -- inspecting ------------------------------------------------------------------------
    @property
    def deliveries(self) -> list[tuple[str, str, Message]]:
        """(idempotency key, provider message id, message) of every delivery, in order."""
        with self._lock:
            return [(d.idempotency_key, d.provider_message_id, d.message) for d in self._deliveries]

    @property
    def sent_messages(self) -> list[Message]:
        """Every delivered message, in order."""
        with self._lock:
            return [d.message for d in self._deliveries]

    def deliveries_for(self, key: str | OperationKey) -> int:
        k = str(key)
        with self._lock:
            return sum(1 for d in self._deliveries if d.idempotency_key == k)

    @property
    def duplicate_deliveries(self) -> int:
        """Messages a recipient got more than once: sum over keys of (deliveries - 1)."""
        with self._lock:
            per_key = Counter(d.idempotency_key for d in self._deliveries)
        return sum(max(0, n - 1) for n in per_key.values())

    @property
    def suppressed_duplicates(self) -> int:
        """Accepted sends the provider recognised by key and did not deliver again."""
        with self._lock:
            return self._suppressed

    @property
    def sends(self) -> int:
        """Every call to `send`."""
        with self._lock:
            return sum(self._sends.values())

    def sends_for(self, key: str | OperationKey) -> int:
        with self._lock:
            return self._sends[str(key)]


# -- customers and rendering -------------------------------------------------------------------


class FakeCustomerSource(CustomerSource):
    """The shop's customer, product and order tables, in memory."""

    def __init__(
        self,
        customers: Iterable[Customer] = (),
        products: Iterable[Product] = (),
        orders: Iterable[Order] = (),
    ) -> None:
        self._lock = threading.Lock()
        self._customers: dict[str, Customer] = {}
        for c in customers:
            self._customers[c.customer_id] = c
        self._products = sorted(products, key=lambda p: p.product_id)
        self._orders = sorted(orders, key=lambda o: (o.ordered_at, o.order_id))

    def customers(self) -> Iterator[Customer]:
        with self._lock:
            current = list(self._customers.values())
        yield from current

    def products(self) -> Iterator[Product]:
        yield from self._products

    def orders(self, since: datetime, until: datetime) -> Iterator[Order]:
        _require_utc(since, "since")
        _require_utc(until, "until")
        yield from (o for o in self._orders if since <= o.ordered_at < until)

    def orders_of(
        self, customer_ids: Sequence[str], since: datetime, until: datetime
    ) -> Iterator[Order]:
        wanted = frozenset(customer_ids)
        yield from (o for o in self.orders(since, until) if o.customer_id in wanted)

    def update(self, customer: Customer) -> None:
        """Replaces the customer with the same id (or adds a new one, e.g. a late sign-up)."""
        with self._lock:
            self._customers[customer.customer_id] = customer


class FakeComposer(Composer):
    """Renders a plain-text digest listing each row's title; can be told to fail per customer."""

    SENDER: ClassVar[str] = "digest@example.com"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failing: set[str] = set()
        self._composed: list[OperationKey] = []

    def fail_for(self, customer_id: str) -> None:
        with self._lock:
            self._failing.add(customer_id)

    def compose(self, item: WorkItem, recipient: str, rows: Sequence[DigestRow]) -> Message:
        key = item.key
        with self._lock:
            if key.customer_id in self._failing:
                raise RenderError(f"render failed for {key}")
            self._composed.append(key)
        titles = [str(r.payload["title"]) for r in rows if "title" in r.payload]
        text = "\n".join([f"Your digest for {key.period}", "", *(f"- {t}" for t in titles)])
        return Message(
            key=key,
            recipient=recipient,
            sender=self.SENDER,
            subject=f"Your digest for {key.period}",
            text=text,
            headers=(("Message-ID", message_id_for(key)), ("X-Digest-Operation-Key", str(key))),
        )

    @property
    def composed(self) -> list[OperationKey]:
        """Keys rendered successfully, in order."""
        with self._lock:
            return list(self._composed)


class PortableComposer(FakeComposer):
    """The fake composer, which a delivery helper process can make for itself (`recipe`)."""

    def recipe(self) -> Callable[[], Composer]:
        return PortableComposer


# -- ledger ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CleanupRecord:
    """The unique cleanup row of one key (at most one, except via the test-only hook)."""

    key: OperationKey
    period: Period
    mode: CleanupMode
    rows: int
    claimed_at: datetime
    completed_at: datetime


@dataclass(frozen=True)
class ArchivedRow:
    """A generated row moved to the archive by an ARCHIVE cleanup."""

    row: DigestRow
    archived_at: datetime


class FakeSecretFingerprints(SecretFingerprints):
    """The fingerprint records in memory; a rotation's audit row goes to `audit` under the lock."""

    def __init__(self, audit: AuditTrail) -> None:
        self._lock = threading.Lock()
        self._audit = audit
        self._records: dict[str, FingerprintRecord] = {}

    def fingerprint_record(self, purpose: str) -> FingerprintRecord | None:
        with self._lock:
            return self._records.get(purpose)

    def record_first_fingerprint(
        self, purpose: str, fingerprint: str, at: datetime
    ) -> FingerprintRecord:
        with self._lock:
            return self._records.setdefault(purpose, FingerprintRecord(purpose, fingerprint, at))

    def rotate_fingerprint(
        self, after: FingerprintRecord, expected: str | None, audit: AuditEntry
    ) -> bool:
        with self._lock:
            found = self._records.get(after.purpose)
            if (found is None) != (expected is None):
                return False
            if found is not None and found.current != expected:
                return False
            self._audit.record_audit(audit)
            self._records[after.purpose] = after
            return True


def _result(name: str, offending: Iterable[str]) -> InvariantResult:
    keys = sorted(set(offending))
    return InvariantResult(name, not keys, len(keys), tuple(keys[:_SAMPLE_SIZE]))


class FakeLedger(Ledger):
    """The ledger in memory, with the SQL ledger's guards (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snapshots: dict[Period, SnapshotInfo] = {}
        self._entries: dict[Period, dict[str, SnapshotEntry]] = {}
        self._rows: dict[OperationKey, list[DigestRow]] = {}
        self._items: dict[OperationKey, WorkItem] = {}
        self._attempts: dict[int, Attempt] = {}
        self._dead_letters: list[DeadLetterRecord] = []
        self._audit: list[AuditEntry] = []
        self._cleanups: list[CleanupRecord] = []
        self._archived: list[ArchivedRow] = []
        self._transitions: list[Transition] = []
        self._attempt_seq = 0
        self._dead_letter_seq = 0
        self._audit_seq = 0
        self._suppressions: dict[str, Suppression] = {}
        #: the feedback store writing provider events for this ledger's keys, if any
        self.feedback: FeedbackStore | None = None
        #: a fake shop is the demo's (the public demo secret may sign its links) unless a test
        #: says it is a real one
        self.demo_data = True
        #: as a database server's ledger: its calls are safe from any thread (the lock above),
        #: so the services' overlapped paths (a ledger thread, cleanup pages in flight) run here
        self.out_of_process = True
        self._fingerprints = FakeSecretFingerprints(self)

    # -- eligibility -----------------------------------------------------------------------
    def freeze_snapshot(
        self, period: Period, run_id: str, selected_at: datetime, entries: Iterable[SnapshotEntry]
    ) -> SnapshotReceipt:
        with self._lock:
            existing = self._snapshots.get(period)
            if existing is not None:
                return SnapshotReceipt(existing, reused=True)
            selected = list(entries)
            by_id: dict[str, SnapshotEntry] = {}
            for e in selected:
                if e.customer_id in by_id:
                    raise ValueError(f"duplicate customer id {e.customer_id} in snapshot")
                by_id[e.customer_id] = e
            info = SnapshotInfo(
                period=period,
                selection_run_id=run_id,
                selected_at=selected_at,
                eligible_count=len(selected),
                fingerprint=snapshot_fingerprint(selected),
                enqueued_at=None,
            )
            self._snapshots[period] = info
            self._entries[period] = by_id
            return SnapshotReceipt(info, reused=False)

    def snapshot(self, period: Period) -> SnapshotInfo | None:
        with self._lock:
            return self._snapshots.get(period)

    def snapshot_entries(self, period: Period) -> list[SnapshotEntry]:
        with self._lock:
            return self._sorted_entries_locked(period)

    def recipients(self, keys: Sequence[OperationKey]) -> dict[OperationKey, str]:
        with self._lock:
            found = {k: self._entries.get(k.period, {}).get(k.customer_id) for k in keys}
            return {k: e.recipient for k, e in found.items() if e is not None}

    def _sorted_entries_locked(self, period: Period) -> list[SnapshotEntry]:
        return sorted(self._entries.get(period, {}).values(), key=lambda e: e.customer_id)

    # -- generated content -----------------------------------------------------------------
    def add_digest_rows(self, rows: Iterable[DigestRow]) -> int:
        with self._lock:
            new = list(rows)
            for r in new:
                self._rows.setdefault(r.key, []).append(r)
            return len(new)

    def digest_rows_of(self, keys: Sequence[OperationKey]) -> dict[OperationKey, list[DigestRow]]:
        with self._lock:
            return {k: sorted(self._rows.get(k, []), key=lambda r: r.position) for k in keys}

    # -- work items ------------------------------------------------------------------------
    def enqueue(self, period: Period, now: datetime) -> EnqueueReceipt:
        with self._lock:
            info = self._snapshots.get(period)
            if info is None:
                raise SnapshotMissing(f"period {period} has no frozen eligibility snapshot")
            keys = [
                OperationKey(period, e.customer_id) for e in self._sorted_entries_locked(period)
            ]
            missing = [k for k in keys if k not in self._items]
            for k in missing:
                self._items[k] = WorkItem(
                    key=k, state=DeliveryState.PENDING, created_at=now, next_attempt_at=now
                )
            if info.enqueued_at is None:
                self._snapshots[period] = replace(info, enqueued_at=now)
            return EnqueueReceipt(created=len(missing), existing=len(keys) - len(missing))

    def claim_due(
        self,
        now: datetime,
        owner: str,
        lease: timedelta,
        limit: int,
        period: Period | None = None,
    ) -> list[Claim]:
        if limit <= 0:
            return []
        with self._lock:
            due = [
                i
                for i in self._items.values()
                if is_due(i, now) and (period is None or i.key.period == period)
            ]
            due.sort(key=lambda i: (i.next_attempt_at, str(i.key)))
            claims: list[Claim] = []
            for item in due[:limit]:
                claim = transitions.claimed(item, owner, now, lease)
                self._items[item.key] = claim.item
                claims.append(claim)
            return claims

    def start_attempts(
        self, claims: Sequence[Claim], now: datetime, *, mailer: str
    ) -> list[AttemptTicket | DigestError]:
        started: list[AttemptTicket | DigestError] = []
        with self._lock:
            for claim in claims:
                try:
                    started.append(self._start_locked(claim, now, mailer))
                except DigestError as e:
                    started.append(e)
        return started

    def _start_locked(self, claim: Claim, now: datetime, mailer: str) -> AttemptTicket:
        current = self._require_locked(claim.key)
        found = self._suppressions.get(claim.key.customer_id)
        if found is not None and current.state is DeliveryState.CLAIMED:
            if current.lease_token == claim.token:
                cancel = transitions.cancelled_by_suppression(current, now, found.reason.value)
                self._apply_locked(cancel)
            raise LostRace(f"{claim.key}: its customer is suppressed; no attempt started")
        started = transitions.attempt_started(claim, current, now)
        self._attempt_seq += 1
        attempt = Attempt(
            attempt_id=self._attempt_seq,
            key=started.key,
            number=started.attempts,
            token=claim.token,
            worker=claim.owner,
            started_at=now,
            finished_at=None,
            outcome=None,
            detail=None,
            provider_message_id=None,
            duplicate=False,
            mailer=mailer,
        )
        self._attempts[attempt.attempt_id] = attempt
        self._items[started.key] = started
        return AttemptTicket(attempt.attempt_id, started.key, started.attempts, claim.token, now)

    def complete_many(
        self, results: Sequence[tuple[AttemptTicket, SendOutcome, Transition]]
    ) -> list[DigestError | None]:
        for _, _, transition in results:
            check_transition(transition.expected, transition.target)
        errors: list[DigestError | None] = []
        with self._lock:
            for ticket, outcome, transition in results:
                try:
                    self._complete_locked(ticket, outcome, transition)
                except DigestError as e:
                    errors.append(e)
                else:
                    errors.append(None)
        return errors

    def _complete_locked(
        self, ticket: AttemptTicket, outcome: SendOutcome, transition: Transition
    ) -> None:
        attempt = self._attempts.get(ticket.attempt_id)
        if attempt is not None and attempt.finished_at is None:
            self._attempts[attempt.attempt_id] = replace(
                attempt,
                finished_at=transition.at,
                outcome=outcome.label,
                detail=outcome.detail,
                provider_message_id=outcome.provider_message_id,
                duplicate=outcome.duplicate,
            )
        self._apply_locked(transition)

    def apply(self, transition: Transition) -> None:
        check_transition(transition.expected, transition.target)
        with self._lock:
            self._apply_locked(transition)

    def _apply_locked(self, t: Transition) -> None:
        """The guarded compare-and-set; validates everything before it changes anything."""
        updated = transitions.apply(self._require_locked(t.key), t)

        replayed: list[tuple[int, DeadLetterRecord]] = []
        if t.has(Reopen):  # a replay marks the key's dead letters replayed
            replayed = [
                (i, replace(d, replayed_at=t.at))
                for i, d in enumerate(self._dead_letters)
                if d.key == t.key and d.replayed_at is None
            ]
        dead_letter = None
        if t.dead_letter_reason:
            dead_letter = DeadLetterRecord(
                dead_letter_id=self._dead_letter_seq + 1,
                key=t.key,
                reason=t.dead_letter_reason,
                last_failure_class=updated.last_failure_class,
                attempts=updated.attempts,
                first_attempt_at=updated.first_attempt_at,
                last_attempt_at=updated.last_attempt_at,
                created_at=t.at,
                replayed_at=None,
            )
        audit = None
        if t.audit is not None:
            audit = AuditEntry(
                at=t.at,
                actor=t.audit.actor,
                action=t.audit.action,
                key=t.key,
                from_state=t.expected,
                to_state=t.target,
                reason=t.audit.reason,
                period=t.key.period,
                audit_id=self._audit_seq + 1,
            )

        # Nothing below can raise: the "commit".
        self._items[t.key] = updated
        for i, d in replayed:
            self._dead_letters[i] = d
        if dead_letter is not None:
            self._dead_letter_seq = dead_letter.dead_letter_id
            self._dead_letters.append(dead_letter)
        if audit is not None:
            self._audit_seq = audit.audit_id
            self._audit.append(audit)
        self._transitions.append(t)

    def recover_expired_leases(self, now: datetime) -> LeaseRecovery:
        with self._lock:
            requeued: list[OperationKey] = []
            unknown: list[OperationKey] = []
            for item in list(self._items.values()):
                if item.state is not DeliveryState.CLAIMED:
                    continue
                if item.lease_expires_at is None or item.lease_expires_at > now:
                    continue
                open_attempt = self._has_open_attempt_locked(item.key, item.lease_token)
                t = transitions.after_lease_expiry(item, open_attempt, now)
                self._items[item.key] = transitions.apply(item, t)
                (unknown if t.target is DeliveryState.UNKNOWN else requeued).append(item.key)
            return LeaseRecovery(
                requeued=tuple(sorted(requeued, key=str)), unknown=tuple(sorted(unknown, key=str))
            )

    def _has_open_attempt_locked(self, key: OperationKey, token: int) -> bool:
        return any(
            a.key == key and a.finished_at is None and a.token == token
            for a in self._attempts.values()
        )

    def cancel_suppressed(self, now: datetime, period: Period | None = None) -> list[OperationKey]:
        with self._lock:
            return self._cancel_locked(now, period=period)

    def _cancel_locked(
        self, now: datetime, *, period: Period | None = None, customer_id: str | None = None
    ) -> list[OperationKey]:
        cancelled: list[OperationKey] = []
        for item in list(self._items.values()):
            found = self._suppressions.get(item.key.customer_id)
            if found is None or period not in (None, item.key.period):
                continue
            # one customer's suppression also ends their claims whose attempt has not started;
            # a period's sweep leaves claims to the start of their attempt, which checks again
            started = customer_id is None or any(
                a.key == item.key and a.token == item.lease_token for a in self._attempts.values()
            )
            if customer_id not in (None, found.customer_id) or not transitions.suppressible(
                item, started
            ):
                continue
            reason = found.reason.value
            self._apply_locked(transitions.cancelled_by_suppression(item, now, reason, started))
            cancelled.append(item.key)
        return sorted(cancelled, key=str)

    def holds_demo_data(self) -> bool:
        return self.demo_data

    @property
    def secret_fingerprints(self) -> SecretFingerprints:
        return self._fingerprints

    # -- the suppression list --------------------------------------------------------------
    def suppressed_ids(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._suppressions)

    def suppress(self, suppression: Suppression, note: str = "") -> bool:
        with self._lock:
            if suppression.customer_id in self._suppressions:
                return False
            kept = replace(suppression, source=suppression.source[:SOURCE_LENGTH])
            self._suppressions[suppression.customer_id] = kept
            self._append_audit_locked(suppression_audit(kept, note))
            self._cancel_locked(suppression.created_at, customer_id=suppression.customer_id)
            return True

    def unsuppress(self, customer_id: str, at: datetime, actor: str, reason: str) -> bool:
        with self._lock:
            if self._suppressions.pop(customer_id, None) is None:
                return False
            self._append_audit_locked(unsuppression_audit(customer_id, at, actor, reason))
            return True

    def suppressions(self) -> list[Suppression]:
        with self._lock:
            return [self._suppressions[c] for c in sorted(self._suppressions)]

    def feedback_counts(self, period: Period) -> FeedbackCounts:
        start, end = unsubscribe_window(period)
        with self._lock:
            unsubscribes = sum(
                s.reason is SuppressionReason.UNSUBSCRIBED and start <= s.created_at < end
                for s in self._suppressions.values()
            )
        # the events are the feedback store's (feedback_fakes.py), which registers itself here
        events = [] if self.feedback is None else self.feedback.provider_events()
        keys = {
            kind: {e.operation_key for e in events if e.type is kind and e.operation_key}
            for kind in (EventType.HARD_BOUNCE, EventType.COMPLAINT)
        }
        mine = {kind: {k for k in found if k.period == period} for kind, found in keys.items()}
        return FeedbackCounts(
            unsubscribes, len(mine[EventType.HARD_BOUNCE]), len(mine[EventType.COMPLAINT])
        )

    def get(self, key: OperationKey) -> WorkItem | None:
        with self._lock:
            return self._items.get(key)

    def items(
        self, period: Period, states: Iterable[DeliveryState] | None = None
    ) -> list[WorkItem]:
        wanted = None if states is None else frozenset(states)
        with self._lock:
            found = [
                i
                for i in self._items.values()
                if i.key.period == period and (wanted is None or i.state in wanted)
            ]
        return sorted(found, key=lambda i: str(i.key))

    def attempts(self, key: OperationKey) -> list[Attempt]:
        with self._lock:
            return sorted(
                (a for a in self._attempts.values() if a.key == key), key=lambda a: a.attempt_id
            )

    def state_counts(self, period: Period) -> dict[DeliveryState, int]:
        with self._lock:
            return dict(Counter(i.state for i in self._items.values() if i.key.period == period))

    def attempt_outcome_counts(self, period: Period) -> dict[str, int]:
        counts: Counter[str] = Counter()
        with self._lock:
            for a in self._attempts.values():
                if a.key.period != period:
                    continue
                if a.finished_at is None or a.outcome is None:
                    counts["open"] += 1
                else:
                    counts[a.outcome] += 1
                if a.duplicate:
                    counts["duplicate"] += 1
        return dict(counts)

    def open_periods(self) -> list[Period]:
        with self._lock:
            return sorted({i.key.period for i in self._items.values() if i.state not in TERMINAL})

    # -- cleanup ---------------------------------------------------------------------------
    def clean_many(
        self, items: Sequence[tuple[OperationKey, int]], mode: CleanupMode, now: datetime
    ) -> list[CleanupReceipt | DigestError]:
        receipts: list[CleanupReceipt | DigestError] = []
        with self._lock:
            for key, token in items:
                try:
                    receipts.append(self._clean_locked(key, token, mode, now))
                except DigestError as e:
                    receipts.append(e)
        return receipts

    def _clean_locked(
        self, key: OperationKey, token: int, mode: CleanupMode, now: datetime
    ) -> CleanupReceipt:
        item = self._require_locked(key)
        if any(c.key == key for c in self._cleanups):
            return CleanupReceipt(key, "already_cleaned", 0)
        done = transitions.cleaned(item, token, now)
        rows = self._rows.pop(key, [])
        if mode is CleanupMode.ARCHIVE:
            self._archived.extend(ArchivedRow(r, now) for r in rows)
        self._cleanups.append(CleanupRecord(key, key.period, mode, len(rows), now, now))
        self._items[key] = done
        return CleanupReceipt(key, "cleaned", len(rows))

    # -- dead letters, audit ---------------------------------------------------------------
    def dead_letters(self, period: Period) -> list[DeadLetterRecord]:
        with self._lock:
            return sorted(
                (d for d in self._dead_letters if d.key.period == period),
                key=lambda d: d.dead_letter_id,
            )

    def record_audit(self, entry: AuditEntry) -> None:
        with self._lock:
            self._append_audit_locked(entry)

    def _append_audit_locked(self, entry: AuditEntry) -> None:
        self._audit_seq += 1
        self._audit.append(replace(entry, audit_id=self._audit_seq))

    def audit_log(self, period: Period | None = None) -> list[AuditEntry]:
        with self._lock:
            entries = [
                e
                for e in self._audit
                if period is None
                or e.period == period
                or (e.key is not None and e.key.period == period)
            ]
        return sorted(entries, key=lambda e: e.audit_id)

    # -- invariants ------------------------------------------------------------------------
    def check_invariants(
        self, period: Period, now: datetime, names: Collection[str] | None = None
    ) -> list[InvariantResult]:
        with self._lock:
            results = [
                _result("at_most_one_cleanup_per_key", self._cleanup_violations_locked(period)),
                _result("no_silent_timeout", self._silent_timeouts_locked(period)),
                _result(
                    "every_customer_has_visible_state", self._invisible_items_locked(period, now)
                ),
                _result("no_duplicate_send", self._double_sends_locked(period)),
                self._snapshot_unchanged_locked(period),
            ]
        return [r for r in results if names is None or r.name in names]

    def keys_with_rows(self, period: Period) -> set[OperationKey]:
        with self._lock:
            return {r.key for rows in self._rows.values() for r in rows if r.key.period == period}

    def due_count(self, now: datetime, period: Period | None = None) -> int:
        with self._lock:
            return sum(
                1
                for i in self._items.values()
                if is_due(i, now) and (period is None or i.period == period)
            )

    def _cleanup_violations_locked(self, period: Period) -> set[str]:
        mine = [c for c in self._cleanups if c.key.period == period]
        per_key = Counter(c.key for c in mine)
        offending = {str(k) for k, n in per_key.items() if n > 1}
        for c in mine:
            item = self._items.get(c.key)
            sent_later = (
                item is not None and item.sent_at is not None and item.sent_at > c.claimed_at
            )
            attempted_later = any(
                a.key == c.key and a.started_at > c.claimed_at for a in self._attempts.values()
            )
            if item is None or item.sent_at is None or sent_later or attempted_later:
                offending.add(str(c.key))
        return offending

    def _silent_timeouts_locked(self, period: Period) -> set[str]:
        offending: set[str] = set()
        for a in self._attempts.values():
            if a.key.period != period:
                continue
            item = self._items.get(a.key)
            held = (
                item is not None
                and item.state is DeliveryState.CLAIMED
                and item.lease_token == a.token
            )
            suspicious = a.outcome == FailureClass.UNKNOWN.value or (
                a.finished_at is None and not held
            )
            if not suspicious:
                continue
            if item is not None and item.state is DeliveryState.UNKNOWN:
                continue
            reconciled = any(
                e.key == a.key and e.action in _RECONCILING_ACTIONS and e.at >= a.started_at
                for e in self._audit
            )
            if not reconciled:
                offending.add(str(a.key))
        return offending

    def _invisible_items_locked(self, period: Period, now: datetime) -> set[str]:
        offending: set[str] = set()
        info = self._snapshots.get(period)
        if info is not None and info.enqueued_at is not None:
            for e in self._entries.get(period, {}).values():
                key = OperationKey(period, e.customer_id)
                if key not in self._items:
                    offending.add(str(key))
        for i in self._items.values():
            if i.key.period != period:
                continue
            stuck_claim = (
                i.state is DeliveryState.CLAIMED
                and i.lease_expires_at is not None
                and i.lease_expires_at <= now
            )
            unscheduled_retry = (
                i.state is DeliveryState.RETRY_SCHEDULED and i.next_attempt_at is None
            )
            if stuck_claim or unscheduled_retry:
                offending.add(str(i.key))
        return offending

    def _double_sends_locked(self, period: Period) -> set[str]:
        """Keys whose history may hold more than one delivery (invariant 4, possible sends)."""
        history: dict[OperationKey, list[Attempt]] = {}
        for a in sorted(self._attempts.values(), key=lambda a: a.attempt_id):
            if a.key.period == period:
                history.setdefault(a.key, []).append(a)
        offending: set[str] = set()
        for key, tries in history.items():
            if len(tries) < 2:
                continue
            item = self._items.get(key)
            held = (
                item.lease_token
                if item is not None and item.state is DeliveryState.CLAIMED
                else None
            )
            audit = [e for e in self._audit if e.key == key]
            if possible_send_count(tries, audit, held) > 1:
                offending.add(str(key))
        return offending

    def _snapshot_unchanged_locked(self, period: Period) -> InvariantResult:
        name = "snapshot_unchanged"
        info = self._snapshots.get(period)
        if info is None:
            return InvariantResult(name, True, 0)
        entries = self._sorted_entries_locked(period)
        if len(entries) != info.eligible_count or snapshot_fingerprint(entries) != (
            info.fingerprint
        ):
            return InvariantResult(name, False, 1, (str(period),))
        return InvariantResult(name, True, 0)

    def _require_locked(self, key: OperationKey) -> WorkItem:
        item = self._items.get(key)
        if item is None:
            raise UnknownWorkItem(f"no work item for {key}")
        return item

    # -- inspection and test-only hooks ----------------------------------------------------
    def open_attempt_count(self, worker: str) -> int:
        """Attempts `worker` has started and not yet recorded, at one instant.

        One lock hold for the whole count: summing `attempts(key)` item by item takes the lock
        per item, and while that walk goes on a worker can record one wave and start the next,
        so the walk would add up attempts that were never open together.
        """
        with self._lock:
            return sum(
                1 for a in self._attempts.values() if a.worker == worker and a.finished_at is None
            )

    def attempt_count(self, worker: str) -> int:
        """Attempts `worker` has started, open or recorded, at one instant (one lock hold)."""
        with self._lock:
            return sum(1 for a in self._attempts.values() if a.worker == worker)

    def leased_unattempted_count(self, owner: str) -> int:
        """Items leased to `owner` with no attempt open, at one instant (one lock hold).

        What a crash of that worker strands until the leases run out.
        """
        with self._lock:
            attempting = {a.key for a in self._attempts.values() if a.finished_at is None}
            return sum(
                1
                for i in self._items.values()
                if i.state is DeliveryState.CLAIMED
                and i.lease_owner == owner
                and i.key not in attempting
            )

    @property
    def cleanups(self) -> list[CleanupRecord]:
        with self._lock:
            return list(self._cleanups)

    @property
    def archived_rows(self) -> list[ArchivedRow]:
        with self._lock:
            return list(self._archived)

    @property
    def transitions(self) -> list[Transition]:
        """Every transition applied (by `apply` or `complete`), in order; lost races excluded."""
        with self._lock:
            return list(self._transitions)

    def force_duplicate_cleanup_record(self, key: OperationKey) -> None:
        """Test-only: a second cleanup record for `key`, past the uniqueness guard."""
        with self._lock:
            first = next((c for c in self._cleanups if c.key == key), None)
            if first is None:
                raise LookupError(f"{key} has no cleanup record to duplicate")
            self._cleanups.append(replace(first, rows=0))

    def force_cleanup_record(self, key: OperationKey, at: datetime) -> None:
        """Test-only: a cleanup record for `key` whatever its state (e.g. one never sent)."""
        with self._lock:
            self._cleanups.append(CleanupRecord(key, key.period, CleanupMode.DELETE, 0, at, at))

    def tamper_snapshot(self, period: Period, customer_id: str, recipient: str) -> None:
        """Test-only: changes a frozen entry's recipient, as a bad migration or hand edit would."""
        with self._lock:
            entries = self._entries[period]
            if customer_id not in entries:
                raise LookupError(f"{customer_id} is not in the snapshot of {period}")
            entries[customer_id] = SnapshotEntry(customer_id, recipient)

    # -- regenerated content ---------------------------------------------------------------
    def replace_digest_rows(
        self, keys: Sequence[OperationKey], rows: Iterable[DigestRow]
    ) -> RowReplacement:
        with self._lock:
            wanted = list(dict.fromkeys(keys))
            new = list(rows)
            strays = sorted({str(r.key) for r in new} - {str(k) for k in wanted})
            if strays:
                raise ValueError(f"rows of keys not being replaced: {', '.join(strays[:3])}")
            refused: dict[OperationKey, DeliveryState | None] = {}
            replaced: set[OperationKey] = set()
            for key in wanted:
                item = self._items.get(key)
                if item is not None and item.state in REGENERABLE:
                    replaced.add(key)
                else:
                    refused[key] = item.state if item is not None else None
            removed = sum(len(self._rows.pop(k, [])) for k in replaced)
            written = [r for r in new if r.key in replaced]
            for r in written:
                self._rows.setdefault(r.key, []).append(r)
            return RowReplacement(frozenset(replaced), refused, removed, len(written))


class WrappingMailer(Mailer):
    """A mailer around another: its capabilities and lookups are the inner mailer's."""

    def __init__(self, inner: Mailer) -> None:
        self._inner = inner

    @property
    def capabilities(self) -> MailerCapabilities:
        return self._inner.capabilities

    @property
    def identity(self) -> str:
        return self._inner.identity

    def lookup(self, idempotency_key: str) -> LookupResult:
        return self._inner.lookup(idempotency_key)


class FaultInjectingMailer(WrappingMailer):
    """Wraps a real mailer: the provider really accepts, then the caller sees a fault.

    It turns the outbox or the HTTP provider into a participant of the crash-point tests: the
    provider's own store, not this wrapper, says how many messages were delivered.
    """

    def __init__(self, inner: Mailer) -> None:
        super().__init__(inner)
        self._crash: set[str] = set()
        self._timeout: set[str] = set()

    def crash_after_accept(self, key: str | OperationKey) -> None:
        self._crash.add(str(key))

    def timeout_after_accept(self, key: str | OperationKey) -> None:
        self._timeout.add(str(key))

    def send(self, message: Message, *, idempotency_key: str) -> SendOutcome:
        outcome = self._inner.send(message, idempotency_key=idempotency_key)
        if idempotency_key in self._crash and outcome.accepted:
            self._crash.discard(idempotency_key)
            raise WorkerCrash(f"worker died after the provider accepted {idempotency_key}")
        if idempotency_key in self._timeout and outcome.accepted:
            self._timeout.discard(idempotency_key)
            return SendOutcome.failed(FailureClass.UNKNOWN, "timeout_after_send")
        return outcome


class SystemicFailureMailer(WrappingMailer):
    """Wraps a mailer: while `failing` is set, every send answers it (a revoked API key: 401)
    without reaching the inner mailer; otherwise the inner mailer sends. Counts every send."""

    def __init__(self, inner: Mailer, failing: SendOutcome | None = None) -> None:
        super().__init__(inner)
        self._lock = threading.Lock()
        self._sends: Counter[str] = Counter()
        self.failing = failing

    def send(self, message: Message, *, idempotency_key: str) -> SendOutcome:
        with self._lock:
            self._sends[idempotency_key] += 1
            failing = self.failing
        if failing is not None:
            return failing
        return self._inner.send(message, idempotency_key=idempotency_key)

    @property
    def attempted_keys(self) -> set[str]:
        """Every key a send was asked for, refused or not."""
        with self._lock:
            return set(self._sends)

    @property
    def sends(self) -> int:
        with self._lock:
            return self._sends.total()
