"""The fake ledger's invariant detectors: design §4's invariants, evaluated on its own records.

The contract suite holds them to the SQL ledger's answers on the same histories.
"""

from collections import Counter
from collections.abc import Collection, Iterable
from datetime import datetime

from digest_pipeline.domain.failures import FailureClass
from digest_pipeline.domain.model import Attempt, InvariantResult, snapshot_fingerprint
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.possible_sends import possible_send_count
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline_tests.fakes.ledger_base import FakeLedgerBase

_SAMPLE_SIZE = 10
_RECONCILING_ACTIONS = frozenset({"reconcile", "resolve"})


def _result(name: str, offending: Iterable[str]) -> InvariantResult:
    keys = sorted(set(offending))
    return InvariantResult(name, not keys, len(keys), tuple(keys[:_SAMPLE_SIZE]))


class FakeInvariants(FakeLedgerBase):
    """`ReadModel.check_invariants` over the records in memory, all under one lock hold."""

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
                key = self._key_locked(period, e.customer_id)
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
