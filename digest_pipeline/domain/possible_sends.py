"""Which attempts may have delivered a key: the rule behind the replay gate and invariant 4.

A confirmed send is a delivery; an `unknown` or abandoned attempt may be one. A replay must not
add a second possible delivery without the operator's explicit acceptance, and
`no_duplicate_send` counts possible deliveries, not only confirmed ones. Pure: the ledgers
apply it to their rows (the SQL ledger as a query over the same constants).
"""

from bisect import bisect_right
from collections import Counter
from collections.abc import Sequence

from digest_pipeline.domain.failures import FailureClass
from digest_pipeline.domain.model import Attempt, AuditEntry
from digest_pipeline.domain.states import DeliveryState

# An attempt *may have delivered* the key when the provider confirmed it (`sent`, not a
# `duplicate` the provider recognised by key), when its outcome is `unknown` (the request may
# have left), or when it is still open and no live claim holds it (its worker died mid-send).
# An uncertain one stops counting when later evidence says nothing was delivered: the mailer's
# lookup found nothing (at reconciliation or at a replay), or an operator resolved it not sent.
# Between two replays one provider's deduplication covers every resend through it (the
# deliverer only resends an `unknown` key inside the window, or after evidence from the mailer
# that made the attempt), so one mailer's share of such a span holds at most one delivery. Two
# mailers deduplicate nothing between them: each one's share counts on its own, and so does a
# replay's span, the other path to a send no provider deduplicates.

#: audit actions that reopen an item; each starts a new span of attempts
REPLAY_ACTIONS = ("replay", "replay_possible_duplicate")
#: reconciliation audit reasons that say nothing was delivered
NOT_DELIVERED_REASONS = (
    "evidence:mailer_lookup_not_found",
    "evidence:ledger_attempts_not_accepted",
)
#: how a replay's audit reason ends when the mailer's lookup found nothing
REPLAY_NOT_FOUND_SUFFIX = "(mailer_lookup_not_found)"


def delivered_attempt(a: Attempt) -> bool:
    """The provider confirmed it and did not call it a duplicate of an earlier send."""
    return a.outcome == "sent" and not a.duplicate


def uncertain_attempt(a: Attempt, held_token: int | None = None) -> bool:
    """Its request may have reached the provider, and nothing it returned says otherwise."""
    if a.outcome == FailureClass.UNKNOWN.value:
        return True
    return a.outcome is None and a.finished_at is None and a.token != held_token


def says_not_delivered(e: AuditEntry) -> bool:
    """An audit row that is evidence the key had not been delivered when it was written."""
    if e.action == "reconcile":
        return e.reason in NOT_DELIVERED_REASONS
    if e.action == "resolve":
        return e.to_state is not DeliveryState.SENT
    if e.action == "replay":
        return e.reason.endswith(REPLAY_NOT_FOUND_SUFFIX)
    return False


def unsettled_uncertain_attempts(
    attempts: Sequence[Attempt], audit: Sequence[AuditEntry], held_token: int | None = None
) -> list[Attempt]:
    """The uncertain attempts no later audit row proves undelivered, in attempt order."""
    cleared = [e.at for e in audit if says_not_delivered(e)]
    return [
        a
        for a in attempts
        if uncertain_attempt(a, held_token) and not any(at >= a.started_at for at in cleared)
    ]


def possible_send_count(
    attempts: Sequence[Attempt], audit: Sequence[AuditEntry], held_token: int | None = None
) -> int:
    """How many deliveries the key's history may hold (invariant 4 fails above one).

    Per span between replays and per mailer in it: its confirmed sends, or one if it holds
    only unsettled uncertain attempts (attempts of no recorded mailer are one mailer's).
    `held_token` is the token of a live claim, whose open attempt is in flight rather than
    lost. `audit` is the key's own audit rows.
    """
    replays = sorted(e.at for e in audit if e.action in REPLAY_ACTIONS)
    unsettled = {a.attempt_id for a in unsettled_uncertain_attempts(attempts, audit, held_token)}
    confirmed: Counter[tuple[int, str]] = Counter()
    unsure: set[tuple[int, str]] = set()
    for a in attempts:
        share = (bisect_right(replays, a.started_at), a.mailer or "")
        if delivered_attempt(a):
            confirmed[share] += 1
        elif a.attempt_id in unsettled:
            unsure.add(share)
    return sum(confirmed.values()) + len(unsure - set(confirmed))
