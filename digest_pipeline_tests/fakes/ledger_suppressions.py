"""The fake ledger's suppression list, and the cancellation of suppressed customers' items."""

from dataclasses import replace
from datetime import datetime

from digest_pipeline.domain import transitions
from digest_pipeline.domain.feedback import (
    SOURCE_LENGTH,
    Suppression,
    suppression_audit,
    unsuppression_audit,
)
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.ports.ledger_roles import SuppressionList
from digest_pipeline_tests.fakes.ledger_queue import FakeWorkQueue


class FakeSuppressions(FakeWorkQueue, SuppressionList):
    """`SuppressionList` in memory; a suppression ends the customer's unstarted items at once."""

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
