"""The fake ledger's work queue: enqueue, claim with a fencing token, start and record attempts.

Every move is the base's compare-and-set; `complete_many` closes an attempt even when its
transition then loses its race, because the closed attempt is evidence for reconciliation.
"""

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from digest_pipeline.domain import transitions
from digest_pipeline.domain.errors import DigestError, LostRace, SnapshotMissing
from digest_pipeline.domain.failures import SendOutcome
from digest_pipeline.domain.model import (
    Attempt,
    AttemptTicket,
    Claim,
    EnqueueReceipt,
    LeaseRecovery,
    Transition,
    WorkItem,
)
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.states import DeliveryState, check_transition
from digest_pipeline.domain.transitions import is_due
from digest_pipeline.ports.ledger_roles import WorkQueue
from digest_pipeline_tests.fakes.ledger_base import FakeLedgerBase


class FakeWorkQueue(FakeLedgerBase, WorkQueue):
    """`WorkQueue` in memory, but for `cancel_suppressed` (`FakeSuppressions`)."""

    def enqueue(self, period: Period, now: datetime) -> EnqueueReceipt:
        with self._lock:
            info = self._snapshots.get(period)
            if info is None:
                raise SnapshotMissing(f"period {period} has no frozen eligibility snapshot")
            keys = [
                self._key_locked(period, e.customer_id) for e in self._sorted_entries_locked(period)
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

    def due_count(self, now: datetime, period: Period | None = None) -> int:
        with self._lock:
            return sum(
                1
                for i in self._items.values()
                if is_due(i, now) and (period is None or i.period == period)
            )

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
