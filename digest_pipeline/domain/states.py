"""The work-item state machine of design §3: the states and the only moves between them.

The ledger checks every move against `ALLOWED_TRANSITIONS` before it issues the guarded SQL
update, and the same table is mirrored as a comment beside the schema.
"""

from enum import StrEnum

from digest_pipeline.domain.errors import InvalidTransition


class DeliveryState(StrEnum):
    """Where one operation key stands; values are the strings stored in SQL."""

    #: selected and enqueued, never claimed
    PENDING = "pending"
    #: leased to one worker, which holds the fencing token
    CLAIMED = "claimed"
    #: the provider confirmed the message (or reconciliation found evidence of it)
    SENT = "sent"
    #: sent, and its generated rows were archived or deleted exactly once
    CLEANED = "cleaned"
    #: a transient or throttled failure; due again at next_attempt_at
    RETRY_SCHEDULED = "retry_scheduled"
    #: the request may have reached the provider; awaiting reconciliation or an operator
    UNKNOWN = "unknown"
    #: permanent failure (invalid recipient, render error); never retried automatically
    FAILED = "failed"
    #: a retry bound (attempts, age, delivery window, unknown retention) was hit
    DEAD_LETTERED = "dead_lettered"
    #: never sent because the customer was suppressed (unsubscribed, bounced, complained, an
    #: operator) after the snapshot froze; the suppression list keeps them out of later weeks
    SUPPRESSED = "suppressed"


class NotRecorded(StrEnum):
    """What a claim came to when the deliverer's own move of it was not the one recorded."""

    #: its compare-and-set lost to another worker, the lease sweeper or an operator
    LOST_RACE = "lost_race"
    #: given back due without an attempt (a refused period, or a run the breaker stopped)
    RELEASED = "released"


#: what the deliverer reports for each claim: the state it recorded, or why it recorded none
Settled = DeliveryState | NotRecorded


#: (from, to) pairs of design §3. `claimed → retry_scheduled` also returns an expired claim that
#: never started an attempt to the queue; `claimed → dead_lettered` ends an item whose failing
#: attempt exhausted a bound, rather than scheduling a retry that could never run.
ALLOWED_TRANSITIONS: frozenset[tuple[DeliveryState, DeliveryState]] = frozenset(
    {
        (DeliveryState.PENDING, DeliveryState.CLAIMED),
        (DeliveryState.CLAIMED, DeliveryState.SENT),
        (DeliveryState.CLAIMED, DeliveryState.RETRY_SCHEDULED),
        (DeliveryState.CLAIMED, DeliveryState.UNKNOWN),
        (DeliveryState.CLAIMED, DeliveryState.FAILED),
        (DeliveryState.CLAIMED, DeliveryState.DEAD_LETTERED),
        (DeliveryState.RETRY_SCHEDULED, DeliveryState.CLAIMED),
        (DeliveryState.RETRY_SCHEDULED, DeliveryState.DEAD_LETTERED),
        (DeliveryState.UNKNOWN, DeliveryState.SENT),
        (DeliveryState.UNKNOWN, DeliveryState.RETRY_SCHEDULED),
        (DeliveryState.UNKNOWN, DeliveryState.DEAD_LETTERED),
        (DeliveryState.SENT, DeliveryState.CLEANED),
        # a suppressed customer's item whose attempt has not started is cancelled, not sent
        (DeliveryState.PENDING, DeliveryState.SUPPRESSED),
        (DeliveryState.RETRY_SCHEDULED, DeliveryState.SUPPRESSED),
        (DeliveryState.CLAIMED, DeliveryState.SUPPRESSED),
        # only `replay` makes these two moves
        (DeliveryState.DEAD_LETTERED, DeliveryState.PENDING),
        (DeliveryState.FAILED, DeliveryState.PENDING),
    }
)

#: States a worker may claim from (when due).
CLAIMABLE: frozenset[DeliveryState] = frozenset(
    {DeliveryState.PENDING, DeliveryState.RETRY_SCHEDULED}
)
#: States that need nothing more from the system (replay can still reopen failed and
#: dead-lettered items; a suppressed one is reopened by nothing).
TERMINAL: frozenset[DeliveryState] = frozenset(
    {
        DeliveryState.CLEANED,
        DeliveryState.FAILED,
        DeliveryState.DEAD_LETTERED,
        DeliveryState.SUPPRESSED,
    }
)
#: States whose generated rows were delivered (or already removed by cleanup): content is never
#: generated for them again.
DELIVERED: frozenset[DeliveryState] = frozenset({DeliveryState.SENT, DeliveryState.CLEANED})
#: States an operator may replay.
REPLAYABLE: frozenset[DeliveryState] = frozenset(
    {DeliveryState.DEAD_LETTERED, DeliveryState.FAILED}
)


def check_transition(current: DeliveryState, target: DeliveryState) -> None:
    """Raises InvalidTransition unless `current → target` is in the table."""
    if (current, target) not in ALLOWED_TRANSITIONS:
        raise InvalidTransition(f"illegal move {current.value} -> {target.value}")
