"""The delivery gate: claim due items, record each attempt before the send, record its outcome.

The outcome's failure class decides the next state through `domain.retry.decide`, and the result
is written with a compare-and-set on the fencing token. Work goes in waves of at most
`concurrency` items: one transaction records the wave's attempts as started, the sends run in
parallel, one transaction records their outcomes; so at most `concurrency` sends are ever open
per worker, and the ledger sees a few statements per wave instead of several per item. A worker
returns only after every claim it took has a recorded terminal state, retry schedule or
`unknown`.
"""

import logging
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from digest_pipeline.domain.chunks import chunked
from digest_pipeline.domain.errors import DigestError, LostRace, RenderError
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import (
    AttemptTicket,
    AuditNote,
    Claim,
    DigestRow,
    Message,
    Transition,
)
from digest_pipeline.domain.periods import OperationKey, Period
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.retry import (
    DeadLetter,
    DeadLetterReason,
    Fail,
    RandomSource,
    Reconcile,
    RetryAt,
    decide,
)
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.ports import Clock, Composer, Ledger, Mailer
from digest_pipeline.services import late
from digest_pipeline.services.evidence import RECONCILE_ACTOR, confirmed_attempt
from digest_pipeline.services.logs import log_event

S = DeliveryState
#: the state a claim is reported in when its compare-and-set lost to another worker or a sweep
LOST_RACE = "lost_race"


@dataclass
class DeliveryReport:
    """What one worker did: claims taken and the state each ended in."""

    claimed: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    #: claims whose compare-and-set lost to another worker or the lease sweeper
    lost_races: int = 0

    def count(self, states: Sequence[str]) -> None:
        for state in states:
            if state == LOST_RACE:
                self.lost_races += 1
            else:
                self.outcomes[state] += 1


@dataclass(frozen=True)
class Content:
    """What messages are made of, read for many claims at once: addresses and rows by key."""

    recipients: dict[OperationKey, str]
    rows: dict[OperationKey, list[DigestRow]]


@dataclass(frozen=True)
class _Started:
    """A claim whose attempt is recorded as started, with what its message is made of."""

    claim: Claim
    ticket: AttemptTicket
    closes_at: datetime | None
    recipient: str | None
    rows: list[DigestRow]


@dataclass
class Wave:
    """Claims on their way through one wave: settled before sending, or started and sending."""

    claims: list[Claim]
    settled: dict[int, str]
    started: list[tuple[int, _Started]]
    sends: list[Future[SendOutcome]]


def _done(value: SendOutcome) -> Future[SendOutcome]:
    f: Future[SendOutcome] = Future()
    f.set_result(value)
    return f


@dataclass(frozen=True)
class Deliverer:
    """Everything one delivery worker needs; `deliver_due` runs it over the due items."""

    ledger: Ledger
    mailer: Mailer
    composer: Composer
    clock: Clock
    policy: DeliveryPolicy
    rand: RandomSource
    owner: str
    #: each period's window close (late grants included), read once per worker
    _closes: dict[Period, datetime] = field(default_factory=dict, compare=False, repr=False)

    def closes_at(self, period: Period) -> datetime:
        """The period's delivery window close, an operator's late grant included."""
        if period not in self._closes:
            self._closes[period] = late.closes_at(self.ledger, self.policy, period)
        return self._closes[period]

    def deliver_one(self, claim: Claim) -> str:
        """Takes one claim to a recorded state; returns that state (or `lost_race`)."""
        [state] = self.finish(self.launch([claim], None))
        return state

    def content(self, claims: Sequence[Claim]) -> Content:
        """The frozen addresses and generated rows of the claims, read in two statements."""
        keys = [c.key for c in claims]
        return Content(self.ledger.recipients(keys), self.ledger.digest_rows_of(keys))

    def launch(
        self,
        claims: Sequence[Claim],
        pool: ThreadPoolExecutor | None,
        content: Content | None = None,
    ) -> Wave:
        """Records what needs no send and starts the other claims' sends.

        Their attempts are recorded as started in one transaction before any send; the sends
        run on `pool`, or here when it is None. `content` may hold the claims' addresses and
        rows already (read once for a whole claim); otherwise they are read here.
        """
        wave = Wave(list(claims), {}, [], [])
        now = self.clock.now()
        to_start: list[tuple[int, Claim, datetime | None]] = []
        for i, claim in enumerate(claims):
            settled = self._settle_without_sending(claim, now)
            if isinstance(settled, str):
                wave.settled[i] = settled
            else:
                to_start.append((i, claim, settled))
        if not to_start:
            return wave
        tickets = self.ledger.start_attempts([c for _, c, _ in to_start], now)
        if content is None:
            content = self.content(
                [
                    c
                    for (_, c, _), t in zip(to_start, tickets, strict=True)
                    if isinstance(t, AttemptTicket)
                ]
            )
        recipients, rows = content.recipients, content.rows
        for (i, claim, closes_at), ticket in zip(to_start, tickets, strict=True):
            if isinstance(ticket, DigestError):
                wave.settled[i] = self._release(claim, ticket)
                continue
            started = _Started(
                claim, ticket, closes_at, recipients.get(claim.key), rows.get(claim.key, [])
            )
            wave.started.append((i, started))
            message = self._compose(started)
            if isinstance(message, SendOutcome):
                wave.sends.append(_done(message))
            elif pool is None:
                wave.sends.append(_done(self._transmit(message)))
            else:
                wave.sends.append(pool.submit(self._transmit, message))
        return wave

    def finish(self, wave: Wave) -> list[str]:
        """Waits for the wave's sends and records every outcome in one transaction.

        Returns each claim's state, in the order the claims came.
        """
        states = dict(wave.settled)
        if wave.started:
            outcomes = [f.result() for f in wave.sends]
            results = [
                (s.ticket, o, self._next(s.claim, o, s.ticket.started_at, s.closes_at))
                for (_, s), o in zip(wave.started, outcomes, strict=True)
            ]
            errors = self.ledger.complete_many(results)
            for (i, s), (ticket, outcome, transition), error in zip(
                wave.started, results, errors, strict=True
            ):
                states[i] = self._logged(s.claim, ticket, outcome, transition, error)
        return [states[i] for i in range(len(wave.claims))]

    def _settle_without_sending(self, claim: Claim, now: datetime) -> str | datetime | None:
        """The recorded state of a claim that must not be sent, or else its window's close.

        A replay has no delivery window: None.
        """
        item = claim.item
        closes_at = None if item.replayed_at is not None else self.closes_at(item.period)
        closed = closes_at is not None and now >= closes_at
        if item.dedupe_until is not None and (
            closed or now + self.policy.lease >= item.dedupe_until
        ):
            # A resend that only the provider's deduplication made safe, and that guarantee
            # (or the delivery window) has run out: back to `unknown`, never a blind send.
            return self._record(
                claim, self._move(claim, S.UNKNOWN, now, detail="dedupe_window_passed")
            )
        if closed:
            return self._record(
                claim,
                self._move(
                    claim,
                    S.DEAD_LETTERED,
                    now,
                    detail="window_closed",
                    dead_letter_reason=DeadLetterReason.WINDOW_CLOSED.value,
                ),
            )
        if item.attempts and (confirmed := self._confirmed_attempt(claim)) is not None:
            return self._record(claim, confirmed)
        return closes_at

    def _move(
        self, claim: Claim, target: DeliveryState, now: datetime, **fields: Any
    ) -> Transition:
        return Transition(claim.key, S.CLAIMED, claim.token, target, now, **fields)

    def _confirmed_attempt(self, claim: Claim) -> Transition | None:
        """Ledger first: a retry whose earlier attempt was confirmed late is not sent again."""
        confirmed = confirmed_attempt(self.ledger, claim.key)
        if confirmed is None:
            return None
        return self._move(
            claim,
            S.SENT,
            self.clock.now(),
            provider_message_id=confirmed.provider_message_id,
            detail="reconciled:ledger_attempt",
            audit=AuditNote(RECONCILE_ACTOR, "reconcile", "evidence:ledger_attempt"),
        )

    def _release(self, claim: Claim, lost: DigestError) -> str:
        """A claim whose lease ran out before its attempt started goes back to the queue."""
        now = self.clock.now()
        current = self.ledger.get(claim.key)
        # An open attempt under this token would mean a send may be in flight: never requeue.
        in_flight = any(
            a.token == claim.token and a.finished_at is None
            for a in self.ledger.attempts(claim.key)
        )
        if (
            current is not None
            and current.state is S.CLAIMED
            and current.lease_token == claim.token
            and not in_flight
        ):
            try:
                self.ledger.apply(
                    self._move(
                        claim,
                        S.RETRY_SCHEDULED,
                        now,
                        next_attempt_at=now,
                        detail="lease_expired_before_attempt",
                    )
                )
            except LostRace:
                pass
            else:
                log_event("released", key=claim.key, reason="lease_expired_before_attempt")
                return S.RETRY_SCHEDULED.value
        if not isinstance(lost, LostRace):
            raise lost
        log_event("lost_race", logging.WARNING, key=claim.key, step="start", why=lost)
        return LOST_RACE

    def _compose(self, started: _Started) -> Message | SendOutcome:
        """The message, or the permanent failure that stops it before anything leaves.

        Composing runs on the worker's own thread: the pool threads then mostly wait on the
        network, and the ledger calls between waves do not queue behind them for the GIL.
        """
        claim, recipient = started.claim, started.recipient
        if recipient is None:
            return SendOutcome.failed(FailureClass.PERMANENT, "no_recipient_in_snapshot")
        try:
            return self.composer.compose(claim.item, recipient, started.rows)
        except RenderError:
            return SendOutcome.failed(FailureClass.PERMANENT, "render_error")
        except Exception as e:
            # Rendering happens before anything leaves, so a composer bug is permanent for this
            # item (replayable once fixed) and must not stop the rest of the batch.
            log_event("render_raised", logging.ERROR, key=claim.key, error=type(e).__name__)
            return SendOutcome.failed(FailureClass.PERMANENT, f"render_raised:{type(e).__name__}")

    def _transmit(self, message: Message) -> SendOutcome:
        try:
            return self.mailer.send(message, idempotency_key=str(message.key))
        except Exception as e:
            # Mailers classify their own failures; one that raises anyway may have sent, so
            # the only safe reading is `unknown`, never "not sent".
            log_event("mailer_raised", logging.ERROR, key=message.key, error=type(e).__name__)
            return SendOutcome.failed(FailureClass.UNKNOWN, f"mailer_raised:{type(e).__name__}")

    def _next(
        self,
        claim: Claim,
        outcome: SendOutcome,
        started_at: datetime,
        closes_at: datetime | None,
    ) -> Transition:
        now = self.clock.now()

        def move(target: DeliveryState, **fields: Any) -> Transition:
            return self._move(claim, target, now, **fields)

        fc = outcome.failure_class
        if fc is None:
            return move(S.SENT, provider_message_id=outcome.provider_message_id)
        throttled = fc is FailureClass.THROTTLED
        item = claim.item
        decision = decide(
            fc,
            # the start of this attempt took one unit; a throttle gives it back
            budget_used=item.budget_used + (0 if throttled else 1),
            window_started_at=item.window_started_at or started_at,
            now=now,
            policy=self.policy.retry,
            rand=self.rand,
            retry_after=outcome.retry_after,
            delivery_closes_at=closes_at,
        )
        failure = {"failure_class": fc, "detail": outcome.detail, "refund_budget": throttled}
        match decision:
            case RetryAt(at):
                return move(S.RETRY_SCHEDULED, next_attempt_at=at, **failure)
            case DeadLetter(reason) | Fail(reason) if item.dedupe_until is not None:
                # This was a resend of an attempt whose outcome is unknown: the first may have
                # been delivered, so the item is not "failed"; a replay must reconcile it first.
                unresolved = DeadLetterReason.UNKNOWN_UNRESOLVED.value
                failure["detail"] = f"{reason.value}:{outcome.detail}"
                return move(S.DEAD_LETTERED, dead_letter_reason=unresolved, **failure)
            case DeadLetter(reason) | Fail(reason):
                target = S.FAILED if isinstance(decision, Fail) else S.DEAD_LETTERED
                return move(target, dead_letter_reason=reason.value, **failure)
            case Reconcile():
                return move(S.UNKNOWN, **failure)
        raise AssertionError(f"unhandled decision {decision!r}")

    def _record(self, claim: Claim, transition: Transition) -> str:
        """Applies a transition that closes no attempt."""
        try:
            self.ledger.apply(transition)
        except LostRace as e:
            return self._logged(claim, None, None, transition, e)
        return self._logged(claim, None, None, transition, None)

    def _logged(
        self,
        claim: Claim,
        ticket: AttemptTicket | None,
        outcome: SendOutcome | None,
        transition: Transition,
        error: DigestError | None,
    ) -> str:
        if error is not None:
            if not isinstance(error, LostRace):
                raise error
            log_event("lost_race", logging.WARNING, key=claim.key, step="record", why=error)
            return LOST_RACE
        # A plain `sent` is the common case: per item only at DEBUG, so a week of 100,000
        # sends does not become 100,000 rows in Dagster's event log; everything else is INFO.
        routine = transition.target is S.SENT and (outcome is None or not outcome.duplicate)
        log_event(
            "attempt_recorded",
            logging.DEBUG if routine else logging.INFO,
            key=claim.key,
            state=transition.target.value,
            outcome=outcome.label if outcome else None,
            detail=transition.detail,
            attempt=ticket.number if ticket else None,
            duplicate=True if outcome is not None and outcome.duplicate else None,
        )
        return transition.target.value


def wave_shape(concurrency: int) -> tuple[int, int]:
    """(items a wave, waves in flight) for a worker of `concurrency` sends.

    Waves in flight times wave size never exceeds `concurrency`. Overlapping waves keep the sends
    going while this thread records; several small waves keep slow sends from idling the pool
    for long, and a floor of 8 items keeps the statements per item low.
    """
    if concurrency < 2:
        return 1, 1
    size = max(1, min(concurrency // 2, max(8, concurrency // 4)))
    return size, concurrency // size


def deliver_due(
    deliverer: Deliverer,
    *,
    batch_size: int,
    concurrency: int,
    period: Period | None = None,
    max_items: int | None = None,
    should_continue: Callable[[], bool] = lambda: True,
) -> DeliveryReport:
    """Claims due items `batch_size` at a time and delivers each batch with bounded concurrency.

    Stops when nothing is due, after `max_items` claims, or when `should_continue` says so.
    """
    if batch_size < 1 or concurrency < 1:
        raise ValueError("batch_size and concurrency must be at least 1")
    report = DeliveryReport()
    size, depth = wave_shape(concurrency)

    def waves() -> Iterator[tuple[list[Claim], Content]]:
        while should_continue():
            room = batch_size if max_items is None else min(batch_size, max_items - report.claimed)
            if room <= 0:
                return
            claims = deliverer.ledger.claim_due(
                deliverer.clock.now(), deliverer.owner, deliverer.policy.lease, room, period
            )
            if not claims:
                return
            report.claimed += len(claims)
            content = deliverer.content(claims)
            for wave in chunked(claims, size):
                yield wave, content

    # `depth` waves overlap: while some waves' sends are in flight, this thread records the
    # outcomes of the wave that finished and starts the next; together they never hold more
    # than `concurrency` open attempts. A wave is finished before the next one is taken, so
    # the next claim happens only once there is room (a crash strands one claim, not two).
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        in_flight: deque[Wave] = deque()
        upcoming = waves()
        while True:
            if len(in_flight) == depth:
                report.count(deliverer.finish(in_flight.popleft()))
            if (taken := next(upcoming, None)) is None:
                break
            wave, content = taken
            in_flight.append(deliverer.launch(wave, pool, content))
        while in_flight:
            report.count(deliverer.finish(in_flight.popleft()))
    if report.claimed:
        log_event(
            "delivered",
            owner=deliverer.owner,
            claimed=report.claimed,
            lost_races=report.lost_races,
            **dict(sorted(report.outcomes.items())),
        )
    return report
