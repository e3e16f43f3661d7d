"""The use cases behind `digest serve`: a one-click unsubscribe and a provider's delivery event.

An unsubscribe checks the link's token before anything else, so a forged link learns nothing
(not even whether the customer exists), then adds the customer to the suppression list once. A
provider event is recorded once per (provider, event id), matched to its work item by the
provider's message id or the operation key it carries, and applied as `domain.feedback.decide`
says: a `delivered` event settles an `unknown` item through the ledger's guarded transition.
"""

from datetime import timedelta
from enum import StrEnum

from digest_pipeline.domain.errors import LostRace
from digest_pipeline.domain.feedback import (
    SUPPRESSES,
    ClaimStatus,
    Decision,
    EventOutcome,
    EventRecord,
    ProviderEvent,
    Suppression,
    SuppressionReason,
    decide,
)
from digest_pipeline.domain.model import WorkItem
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.domain.reconciliation import delivered_per_provider
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.domain.unsubscribe import token_matches
from digest_pipeline.ports.feedback import FeedbackStore
from digest_pipeline.ports.ledger_roles import ReadModel, WorkQueue
from digest_pipeline.ports.outside import Clock
from digest_pipeline.services.logs import item_log, step_log

#: the audit actor of a move made on a provider event
PROVIDER_EVENT_ACTOR = "system:provider_event"
#: the suppression source of a one-click unsubscribe
ONE_CLICK = "one_click"
#: how long a `received` event belongs to the request applying it; a crashed one is taken over
#: after this (the provider retries a failed delivery minutes later)
EVENT_LEASE = timedelta(seconds=60)


class LinkCheck(StrEnum):
    """What an unsubscribe link's token and customer id come to."""

    #: the token is the customer's and the customer exists
    VALID = "valid"
    #: the token is not this customer id's (checked first, for every id)
    FORBIDDEN = "forbidden"
    #: a good token for an id neither the source nor any snapshot knows
    UNKNOWN_CUSTOMER = "unknown_customer"


class Unsubscribed(StrEnum):
    """What a valid one-click unsubscribe did (both answer the same to the customer)."""

    #: added to the suppression list now
    NOW = "now"
    #: on the list already (unsubscribed, bounced, complained or suppressed before)
    ALREADY = "already"


def check_link(store: FeedbackStore, secret: str, customer_id: str, token: str) -> LinkCheck:
    """The token first, in constant time, for any id; only a good token asks whether it exists.

    So a forged link gets the same refusal for every id, and cannot probe for customers.
    """
    if not token_matches(secret, customer_id, token):
        return LinkCheck.FORBIDDEN
    if not store.known_customer(customer_id):
        return LinkCheck.UNKNOWN_CUSTOMER
    return LinkCheck.VALID


def unsubscribe(
    store: FeedbackStore, clock: Clock, secret: str, customer_id: str, token: str
) -> LinkCheck | Unsubscribed:
    """Suppresses the customer of a valid link (idempotent), or says why the link is refused."""
    check = check_link(store, secret, customer_id, token)
    if check is not LinkCheck.VALID:
        return check
    suppression = Suppression(customer_id, SuppressionReason.UNSUBSCRIBED, ONE_CLICK, clock.now())
    if not store.suppress(suppression):
        return Unsubscribed.ALREADY
    step_log.info("unsubscribed", customer_id=customer_id, source=ONE_CLICK)
    return Unsubscribed.NOW


def _match(
    store: FeedbackStore, ledger: ReadModel, event: ProviderEvent
) -> tuple[OperationKey | None, WorkItem | None]:
    """The event's work item: by the provider's message id, else by the key it carries.

    The message id is the provider's own link to an attempt the ledger recorded; the key the
    event echoes is the only link for an `unknown` item, whose send never got an id back.
    """
    candidates: list[OperationKey] = []
    if event.provider_message_id is not None:
        found = store.key_of_provider_message(event.provider_message_id)
        if found is not None:
            candidates.append(found)
    if event.operation_key is not None and event.operation_key not in candidates:
        candidates.append(event.operation_key)
    for key in candidates:
        item = ledger.get(key)
        if item is not None:
            return key, item
    return (candidates[0] if candidates else None), None


class EventResult(StrEnum):
    """How a webhook request for one event ended (the HTTP layer maps it to a status)."""

    #: applied now, with the outcome recorded
    APPLIED = "applied"
    #: applied before; nothing changed
    DUPLICATE = "duplicate"
    #: another request is applying it: the provider should retry later
    IN_PROGRESS = "in_progress"


def record_event(
    store: FeedbackStore, ledger: ReadModel, queue: WorkQueue, clock: Clock, event: ProviderEvent
) -> tuple[EventResult, EventOutcome | None]:
    """Records one provider event once and applies it; a repeat of the same id changes nothing."""
    now = clock.now()
    key, item = _match(store, ledger, event)
    received = EventRecord(
        provider=event.provider,
        event_id=event.event_id,
        type=event.type,
        operation_key=key,
        provider_message_id=event.provider_message_id,
        received_at=now,
        outcome=EventOutcome.RECEIVED,
    )
    claim = store.begin_event(received, EVENT_LEASE)
    if claim.status is ClaimStatus.DONE:
        return EventResult.DUPLICATE, claim.outcome
    if claim.status is ClaimStatus.IN_PROGRESS:
        return EventResult.IN_PROGRESS, None
    outcome = _apply(store, ledger, queue, clock, event, key, item)
    store.finish_event(event.provider, event.event_id, outcome)
    # an event that names no work item is the webhook's line, not an item's
    (step_log if key is None else item_log).info(
        "provider_event",
        key=key,
        provider=event.provider,
        event_id=event.event_id,
        type=event.type.value,
        outcome=outcome.value,
    )
    return EventResult.APPLIED, outcome


def _apply(
    store: FeedbackStore,
    ledger: ReadModel,
    queue: WorkQueue,
    clock: Clock,
    event: ProviderEvent,
    key: OperationKey | None,
    item: WorkItem | None,
) -> EventOutcome:
    decision = decide(event.type, None if item is None else item.state)
    if key is None or item is None or decision is Decision.UNMATCHED:
        return EventOutcome.UNMATCHED
    if decision is Decision.SETTLE_SENT:
        return _settle(ledger, queue, clock, event, item)
    if decision is Decision.CONFIRM:
        return EventOutcome.CONFIRMED
    if decision is Decision.LEAVE:
        return EventOutcome.NOT_SETTLED
    if decision is Decision.SUPPRESS:
        source = f"provider:{event.provider}:{event.event_id}"
        suppression = Suppression(key.customer_id, SUPPRESSES[event.type], source, clock.now())
        if not store.suppress(suppression):
            return EventOutcome.ALREADY_SUPPRESSED
        step_log.info("suppressed", customer_id=key.customer_id, reason=suppression.reason.value)
        return EventOutcome.SUPPRESSED
    return EventOutcome.RECORDED


def _settle(
    ledger: ReadModel, queue: WorkQueue, clock: Clock, event: ProviderEvent, item: WorkItem
) -> EventOutcome:
    """`unknown → sent` on the event's evidence, as a compare-and-set; a lost race is reported.

    `item` was read when the event was matched; if it moved since, the guarded update says so
    and the item is read again for what the event then came to.
    """
    transition = delivered_per_provider(
        item, clock.now(), event.provider_message_id, PROVIDER_EVENT_ACTOR
    )
    try:
        queue.apply(transition)
    except LostRace as e:
        item_log.warning("lost_race", key=item.key, step="provider_event", why=e)
        again = ledger.get(item.key)
        return _after_race(again.state if again is not None else None)
    return EventOutcome.SETTLED_SENT


def _after_race(state: DeliveryState | None) -> EventOutcome:
    """What a `delivered` event came to when the item moved before it could settle it."""
    if state in (DeliveryState.SENT, DeliveryState.CLEANED):
        return EventOutcome.CONFIRMED
    return EventOutcome.NOT_SETTLED
