"""The real ledger, observed: every call goes to it unchanged, and the simulator learns when.

The wrapper adds no rule. It tells the engine when claims were taken (to schedule lease
recovery at their expiry and redeliveries of a claim), when an item becomes due (to wake an idle
worker then instead of polling), and counts what the ledger keeps no record of: cleanup calls,
claims given back because their lease ran out before the attempt, lost races, and the virtual
second each backoff retry was scheduled to wake in. A cleanup whose acknowledgement is lost raises
`SimulatedCrash` after the ledger committed. A compare-and-set that matched no row (LostRace)
is counted as it passes through, since a crashed worker's own report of it dies with it.
"""

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from datetime import datetime, timedelta

from digest_pipeline.domain.delivery import LEASE_EXPIRED_BEFORE_ATTEMPT
from digest_pipeline.domain.errors import DigestError, LostRace
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.feedback import FeedbackCounts, Suppression
from digest_pipeline.domain.model import (
    Attempt,
    AttemptTicket,
    AuditEntry,
    Claim,
    CleanupMode,
    CleanupReceipt,
    DeadLetterRecord,
    DigestRow,
    EnqueueReceipt,
    InvariantResult,
    LeaseRecovery,
    SnapshotEntry,
    SnapshotInfo,
    SnapshotReceipt,
    Transition,
    WorkItem,
)
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.ports import Ledger, SecretFingerprints
from digest_pipeline.rigs.sim.faults import SimulatedCrash

#: the detail `Deliverer` records when it gives back a claim whose lease ran out before it started
RELEASED = LEASE_EXPIRED_BEFORE_ATTEMPT
BACKOFF = frozenset({FailureClass.TRANSIENT, FailureClass.THROTTLED})


class ObservedLedger(Ledger):
    """Delegates every call to `inner`; see the module docstring for what it observes."""

    def __init__(
        self,
        inner: Ledger,
        *,
        on_claims: Callable[[list[Claim]], None],
        on_due: Callable[[datetime], None],
        lose_cleanup_ack: Callable[[OperationKey], bool],
    ) -> None:
        self.inner = inner
        self._on_claims = on_claims
        self._on_due = on_due
        self._lose_cleanup_ack = lose_cleanup_ack
        self.cleanup_calls = 0
        self.cleanup_acks_lost = 0
        self.released = 0
        self.recovered_requeued = 0
        self.recovered_unknown = 0
        #: compare-and-sets that matched no row, and those that were a send's outcome
        self.lost_races = 0
        self.late_results = 0
        #: backoff retries (transient, throttled) by the virtual second they are due
        self.backoff_wakes: Counter[datetime] = Counter()

    def _observe(self, t: Transition) -> None:
        if t.next_attempt_at is not None:
            self._on_due(t.next_attempt_at)
        if t.target is DeliveryState.RETRY_SCHEDULED and t.failure_class in BACKOFF:
            assert t.next_attempt_at is not None
            self.backoff_wakes[t.next_attempt_at.replace(microsecond=0)] += 1
        if t.detail == RELEASED:
            self.released += 1

    # -- observed --------------------------------------------------------------------------
    def enqueue(self, period: Period, now: datetime) -> EnqueueReceipt:
        receipt = self.inner.enqueue(period, now)
        self._on_due(now)
        return receipt

    def claim_due(
        self,
        now: datetime,
        owner: str,
        lease: timedelta,
        limit: int,
        period: Period | None = None,
    ) -> list[Claim]:
        claims = self.inner.claim_due(now, owner, lease, limit, period)
        if claims:
            self._on_claims(claims)
        return claims

    def start_attempts(
        self, claims: Sequence[Claim], now: datetime, *, mailer: str
    ) -> list[AttemptTicket | DigestError]:
        started = self.inner.start_attempts(claims, now, mailer=mailer)
        self.lost_races += sum(isinstance(s, LostRace) for s in started)
        return started

    def complete_many(
        self, results: Sequence[tuple[AttemptTicket, SendOutcome, Transition]]
    ) -> list[DigestError | None]:
        errors = self.inner.complete_many(results)
        for (_, _, transition), error in zip(results, errors, strict=True):
            if isinstance(error, LostRace):
                self.lost_races += 1
                self.late_results += 1
            elif error is None:
                self._observe(transition)
        return errors

    def apply(self, transition: Transition) -> None:
        try:
            self.inner.apply(transition)
        except LostRace:
            self.lost_races += 1
            raise
        self._observe(transition)

    def recover_expired_leases(self, now: datetime) -> LeaseRecovery:
        recovery = self.inner.recover_expired_leases(now)
        self.recovered_requeued += len(recovery.requeued)
        self.recovered_unknown += len(recovery.unknown)
        if recovery.requeued:
            self._on_due(now)
        return recovery

    def clean_many(
        self, items: Sequence[tuple[OperationKey, int]], mode: CleanupMode, now: datetime
    ) -> list[CleanupReceipt | DigestError]:
        # One key at a time, so a lost acknowledgement stops the batch where a real worker's
        # crash would: the keys after it are not cleaned until the step is retried.
        receipts: list[CleanupReceipt | DigestError] = []
        for key, token in items:
            self.cleanup_calls += 1
            [receipt] = self.inner.clean_many([(key, token)], mode, now)
            if isinstance(receipt, LostRace):
                self.lost_races += 1
            elif (
                isinstance(receipt, CleanupReceipt)
                and receipt.status == "cleaned"
                and self._lose_cleanup_ack(key)
            ):
                self.cleanup_acks_lost += 1
                raise SimulatedCrash(
                    f"cleanup of {key} committed; its acknowledgement was lost", key, token
                )
            receipts.append(receipt)
        return receipts

    # -- delegated unchanged ---------------------------------------------------------------
    def freeze_snapshot(
        self, period: Period, run_id: str, selected_at: datetime, entries: Iterable[SnapshotEntry]
    ) -> SnapshotReceipt:
        return self.inner.freeze_snapshot(period, run_id, selected_at, entries)

    def snapshot(self, period: Period) -> SnapshotInfo | None:
        return self.inner.snapshot(period)

    def snapshot_entries(self, period: Period) -> list[SnapshotEntry]:
        return self.inner.snapshot_entries(period)

    def recipients(self, keys: Sequence[OperationKey]) -> dict[OperationKey, str]:
        return self.inner.recipients(keys)

    def feedback_counts(self, period: Period) -> FeedbackCounts:
        return self.inner.feedback_counts(period)

    def holds_demo_data(self) -> bool:
        return self.inner.holds_demo_data()

    @property
    def secret_fingerprints(self) -> SecretFingerprints:
        return self.inner.secret_fingerprints

    @property
    def instance(self) -> str:
        return self.inner.instance

    def suppressed_ids(self) -> frozenset[str]:
        return self.inner.suppressed_ids()

    def cancel_suppressed(self, now: datetime, period: Period | None = None) -> list[OperationKey]:
        return self.inner.cancel_suppressed(now, period)

    def suppress(self, suppression: Suppression, note: str = "") -> bool:
        return self.inner.suppress(suppression, note)

    def unsuppress(self, customer_id: str, at: datetime, actor: str, reason: str) -> bool:
        return self.inner.unsuppress(customer_id, at, actor, reason)

    def suppressions(self) -> list[Suppression]:
        return self.inner.suppressions()

    def add_digest_rows(self, rows: Iterable[DigestRow]) -> int:
        return self.inner.add_digest_rows(rows)

    def digest_rows_of(self, keys: Sequence[OperationKey]) -> dict[OperationKey, list[DigestRow]]:
        return self.inner.digest_rows_of(keys)

    def keys_with_rows(self, period: Period) -> set[OperationKey]:
        return self.inner.keys_with_rows(period)

    def due_count(self, now: datetime, period: Period | None = None) -> int:
        return self.inner.due_count(now, period)

    def get(self, key: OperationKey) -> WorkItem | None:
        return self.inner.get(key)

    def items(
        self, period: Period, states: Iterable[DeliveryState] | None = None
    ) -> list[WorkItem]:
        return self.inner.items(period, states)

    def attempts(self, key: OperationKey) -> list[Attempt]:
        return self.inner.attempts(key)

    def state_counts(self, period: Period) -> dict[DeliveryState, int]:
        return self.inner.state_counts(period)

    def attempt_outcome_counts(self, period: Period) -> dict[str, int]:
        return self.inner.attempt_outcome_counts(period)

    def open_periods(self) -> list[Period]:
        return self.inner.open_periods()

    def dead_letters(self, period: Period) -> list[DeadLetterRecord]:
        return self.inner.dead_letters(period)

    def record_audit(self, entry: AuditEntry) -> None:
        self.inner.record_audit(entry)

    def audit_log(self, period: Period | None = None) -> list[AuditEntry]:
        return self.inner.audit_log(period)

    def check_invariants(
        self, period: Period, now: datetime, names: Collection[str] | None = None
    ) -> list[InvariantResult]:
        return self.inner.check_invariants(period, now, names)
