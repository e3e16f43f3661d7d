"""The possible-delivery rule behind the replay gate and invariant 4, one history per row."""

from datetime import timedelta

import pytest

from digest_pipeline.domain.model import Attempt, AuditEntry
from digest_pipeline.domain.possible_sends import (
    possible_send_count,
    unsettled_uncertain_attempts,
)
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline_tests.builders import key_of
from digest_pipeline_tests.conftest import T0

KEY = key_of(1)


def attempt(n: int, outcome: str | None, *, duplicate: bool = False, token: int = 1) -> Attempt:
    """Attempt `n` started n hours after T0."""
    at = T0 + timedelta(hours=n)
    finished = None if outcome is None else at
    return Attempt(n, KEY, n, token, "w1", at, finished, outcome, None, None, duplicate)


def audit(
    hours: float, action: str, reason: str = "", to: DeliveryState | None = None
) -> AuditEntry:
    return AuditEntry(T0 + timedelta(hours=hours), "ana", action, KEY, None, to, reason)


REPLAY = audit(1.5, "replay", "OPS-1 (mailer_lookup_unsupported)", DeliveryState.PENDING)
ACCEPTED = audit(
    1.5, "replay_possible_duplicate", "OPS-1 (operator accepted …)", DeliveryState.PENDING
)


@pytest.mark.parametrize(
    ("attempts", "rows", "count"),
    [
        # one confirmed send
        ([attempt(1, "sent")], [], 1),
        # two confirmed sends: the bug invariant 4 always caught
        ([attempt(1, "sent"), attempt(2, "sent")], [], 2),
        # unknown, then a resend the provider recognised: one delivery
        ([attempt(1, "unknown"), attempt(2, "sent", duplicate=True)], [], 1),
        # unknown, then an unflagged resend inside the window (no replay between): one
        ([attempt(1, "unknown"), attempt(2, "sent")], [], 1),
        # unknown, then the lookup found nothing, then a resend: one
        (
            [attempt(1, "unknown"), attempt(2, "sent")],
            [audit(1.5, "reconcile", "evidence:mailer_lookup_not_found")],
            1,
        ),
        # unknown, an operator said not sent, then a resend: one
        (
            [attempt(1, "unknown"), attempt(2, "sent")],
            [audit(1.5, "resolve", "relay log", DeliveryState.RETRY_SCHEDULED)],
            1,
        ),
        # unknown, then a replay, then a send: possibly two
        ([attempt(1, "unknown"), attempt(2, "sent")], [REPLAY], 2),
        ([attempt(1, "unknown"), attempt(2, "sent")], [ACCEPTED], 2),
        # unknown, a replay the lookup cleared, then a send: one
        (
            [attempt(1, "unknown"), attempt(2, "sent")],
            [audit(1.5, "replay", "OPS-1 (mailer_lookup_not_found)", DeliveryState.PENDING)],
            1,
        ),
        # unknown, a replay, then the provider recognised the key: one
        ([attempt(1, "unknown"), attempt(2, "sent", duplicate=True)], [ACCEPTED], 1),
        # abandoned mid-send (never closed), a replay, then a send: possibly two
        ([attempt(1, None), attempt(2, "sent")], [ACCEPTED], 2),
        # the lookup's "not found" came before the unknown attempt: it proves nothing about it
        (
            [attempt(1, "transient"), attempt(2, "unknown"), attempt(3, "sent")],
            [audit(1.5, "reconcile", "evidence:mailer_lookup_not_found"), audit(2.5, "replay")],
            2,
        ),
        # transient failures never left: only the send counts
        ([attempt(1, "transient"), attempt(2, "sent")], [REPLAY], 1),
    ],
)
def test_possible_send_count(attempts, rows, count):
    assert possible_send_count(attempts, rows) == count


def test_an_open_attempt_of_the_live_claim_is_in_flight_not_uncertain():
    history = [attempt(1, "unknown"), attempt(2, None, token=7)]

    assert possible_send_count(history, [ACCEPTED], held_token=7) == 1
    assert possible_send_count(history, [ACCEPTED]) == 2


def test_unsettled_attempts_are_the_uncertain_ones_no_evidence_cleared():
    history = [attempt(1, "unknown"), attempt(2, "permanent"), attempt(3, "unknown")]
    cleared_first = [audit(1.5, "resolve", "looked lost", DeliveryState.RETRY_SCHEDULED)]

    assert [a.number for a in unsettled_uncertain_attempts(history, [])] == [1, 3]
    assert [a.number for a in unsettled_uncertain_attempts(history, cleared_first)] == [3]
