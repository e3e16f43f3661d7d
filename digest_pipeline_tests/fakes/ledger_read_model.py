"""The fake ledger's reads (items, attempts, counts, dead letters, feedback) and its audit trail."""

from collections import Counter
from collections.abc import Iterable

from digest_pipeline.domain.feedback import (
    EventType,
    FeedbackCounts,
    SuppressionReason,
    unsubscribe_window,
)
from digest_pipeline.domain.model import Attempt, AuditEntry, DeadLetterRecord, WorkItem
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.states import TERMINAL, DeliveryState
from digest_pipeline.ports.ledger_roles import AuditTrail, ReadModel
from digest_pipeline_tests.fakes.ledger_base import FakeLedgerBase


class FakeReadModel(FakeLedgerBase, ReadModel, AuditTrail):
    """`ReadModel` (but for `check_invariants`, `FakeInvariants`) and `AuditTrail` in memory."""

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
        # this instance's keys only, as the SQL ledger counts them: an endpoint also records
        # other instances' events (unmatched)
        mine = {
            kind: {k for k in found if k.period == period and k.instance == self._instance}
            for kind, found in keys.items()
        }
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

    def dead_letters(self, period: Period) -> list[DeadLetterRecord]:
        with self._lock:
            return sorted(
                (d for d in self._dead_letters if d.key.period == period),
                key=lambda d: d.dead_letter_id,
            )

    def record_audit(self, entry: AuditEntry) -> None:
        with self._lock:
            self._append_audit_locked(entry)

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
