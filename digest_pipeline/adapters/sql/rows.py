"""Row ↔ record mapping for the SQL ledger, kept apart so the ledger reads as its transactions."""

from sqlalchemy import RowMapping

from digest_pipeline.domain.failures import FailureClass
from digest_pipeline.domain.model import (
    Attempt,
    AuditEntry,
    DeadLetterRecord,
    ItemLease,
    ItemTimes,
    WorkItem,
)
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.states import DeliveryState

Row = RowMapping


def failure_class(value: str | None) -> FailureClass | None:
    """The enum for a stored failure class, if any."""
    return FailureClass(value) if value is not None else None


def stored_key(r: Row) -> OperationKey:
    """The operation key a `work_items` row stores, from its period and customer columns.

    Its instance is what its key's text holds before them (`enqueue` writes the text so), not
    the reading ledger's: a key read back is the one stored, and the guarded updates that name
    it match its row. Sliced, not parsed: millions of rows a week are read back.
    """
    period, customer_id = r["period"], r["customer_id"]
    instance = r["operation_key"][: -len(period) - len(customer_id) - 2]
    return OperationKey(Period.parse(period), customer_id, instance)


def work_item(r: Row) -> WorkItem:
    """A `work_items` row as a WorkItem."""
    return WorkItem(
        key=stored_key(r),
        state=DeliveryState(r["state"]),
        created_at=r["created_at"],
        next_attempt_at=r["next_attempt_at"],
        attempts=r["attempts"],
        budget_used=r["budget_used"],
        window_started_at=r["window_started_at"],
        first_attempt_at=r["first_attempt_at"],
        last_attempt_at=r["last_attempt_at"],
        last_failure_class=failure_class(r["last_failure_class"]),
        last_detail=r["last_detail"],
        lease_owner=r["lease_owner"],
        lease_token=r["lease_token"],
        lease_expires_at=r["lease_expires_at"],
        first_claimed_at=r["first_claimed_at"],
        provider_message_id=r["provider_message_id"],
        sent_at=r["sent_at"],
        cleaned_at=r["cleaned_at"],
        replayed_at=r["replayed_at"],
        dedupe_until=r["dedupe_until"],
    )


def item_times(r: Row) -> ItemTimes:
    """The state and times of a `work_items` row (`ReadModel.iter_item_times`)."""
    return ItemTimes(
        DeliveryState(r["state"]),
        r["created_at"],
        r["first_claimed_at"],
        r["sent_at"],
        r["cleaned_at"],
    )


def item_lease(r: Row) -> ItemLease:
    """The key, state and token of a `work_items` row (`ReadModel.iter_item_leases`)."""
    return ItemLease(
        stored_key(r),
        DeliveryState(r["state"]),
        r["lease_token"],
    )


def attempt(r: Row) -> Attempt:
    """An `attempts` row as an Attempt."""
    return Attempt(
        attempt_id=r["attempt_id"],
        key=OperationKey.parse(r["operation_key"]),
        number=r["number"],
        token=r["lease_token"],
        worker=r["worker"],
        started_at=r["started_at"],
        finished_at=r["finished_at"],
        outcome=r["outcome"],
        detail=r["detail"],
        provider_message_id=r["provider_message_id"],
        duplicate=bool(r["duplicate"]),
        mailer=r["mailer"],
    )


def dead_letter(r: Row) -> DeadLetterRecord:
    """A `dead_letters` row as a DeadLetterRecord."""
    return DeadLetterRecord(
        dead_letter_id=r["dead_letter_id"],
        key=OperationKey.parse(r["operation_key"]),
        reason=r["reason"],
        last_failure_class=failure_class(r["last_failure_class"]),
        attempts=r["attempts"],
        first_attempt_at=r["first_attempt_at"],
        last_attempt_at=r["last_attempt_at"],
        created_at=r["created_at"],
        replayed_at=r["replayed_at"],
    )


def audit_entry(r: Row) -> AuditEntry:
    """An `audit_log` row as an AuditEntry."""
    return AuditEntry(
        at=r["at"],
        actor=r["actor"],
        action=r["action"],
        key=OperationKey.parse(r["operation_key"]) if r["operation_key"] else None,
        from_state=DeliveryState(r["from_state"]) if r["from_state"] else None,
        to_state=DeliveryState(r["to_state"]) if r["to_state"] else None,
        reason=r["reason"],
        period=Period.parse(r["period"]) if r["period"] else None,
        audit_id=r["audit_id"],
    )
