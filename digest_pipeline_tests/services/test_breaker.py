"""A systemic provider failure stops the run instead of spinning through the list.

A revoked API key answers 401 to every send. The circuit breaker stops the worker after
`breaker_threshold` consecutive attempts with the same class and code: at most that many items
are attempted, the rest stay due and untouched, the run fails with one line naming the code, and
an attempt refused for our credentials is retried later, never `failed` (the customer did
nothing wrong).
"""

from datetime import timedelta

import pytest

from digest_pipeline.domain.errors import BreakerOpen
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import CleanupMode, Transition
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.services.deliver import deliver_due
from digest_pipeline.services.pipeline import sweep
from digest_pipeline.services.wave import DeliveryReport
from digest_pipeline_tests.builders import (
    complete_one,
    frozen_ledger,
    key_of,
    make_deliverer,
    start_one,
)
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.fakes import FakeLedger, FakeMailer, SystemicFailureMailer

# every test here on both delivery loops: a provider's pool and a local mailer's ledger thread
pytestmark = pytest.mark.usefixtures("both_mailer_kinds")

THRESHOLD = 20
CUSTOMERS = 100
BAD_KEY = SendOutcome.failed(FailureClass.PERMANENT, "http:401:invalid_api_key")
SMTP_AUTH = SendOutcome.failed(FailureClass.PERMANENT, "smtp:535:5.7.8")
REJECTED = SendOutcome.failed(FailureClass.PERMANENT, "http:422:validation_error")


def revoked(clock, failing: SendOutcome = BAD_KEY) -> tuple[FakeLedger, SystemicFailureMailer]:
    return frozen_ledger(CUSTOMERS), SystemicFailureMailer(FakeMailer(clock=clock), failing)


def run(ledger, mailer, clock, *, concurrency: int = 4, batch_size: int = 50, **kwargs):
    return deliver_due(
        make_deliverer(ledger, mailer, clock),
        batch_size=batch_size,
        concurrency=concurrency,
        period=W42,
        breaker_threshold=THRESHOLD,
        **kwargs,
    )


@pytest.mark.parametrize(("concurrency", "batch_size"), [(1, 50), (4, 50), (16, 128), (8, 5)])
@pytest.mark.parametrize("failing", [BAD_KEY, SMTP_AUTH], ids=["http_401", "smtp_535"])
def test_a_credential_refusal_on_every_send_stops_the_run_at_the_threshold(
    clock, concurrency, batch_size, failing
):
    ledger, mailer = revoked(clock, failing)

    with pytest.raises(BreakerOpen) as stopped:
        run(ledger, mailer, clock, concurrency=concurrency, batch_size=batch_size)

    line = str(stopped.value)
    assert failing.detail in line
    assert "period 2026-W42" in line
    assert "credentials" in line
    assert "\n" not in line
    assert "@" not in line
    assert mailer.sends <= THRESHOLD
    items = ledger.items(W42)
    attempted = [i for i in items if i.attempts]
    assert len(attempted) == mailer.sends == THRESHOLD
    # not the customer's fault: retried once the sender is fixed, never failed or dead-lettered
    assert {i.state for i in attempted} == {DeliveryState.RETRY_SCHEDULED}
    assert {i.last_detail for i in attempted} == {failing.detail}
    assert ledger.dead_letters(W42) == []
    # the rest were never claimed: pending, due, no lease taken
    rest = [i for i in items if not i.attempts]
    assert len(rest) == CUSTOMERS - THRESHOLD
    assert all(i.state is DeliveryState.PENDING and i.lease_token == 0 for i in rest)


def test_the_run_that_stopped_reports_what_it_did(clock):
    ledger, mailer = revoked(clock)
    report = DeliveryReport()
    with pytest.raises(BreakerOpen):
        run(ledger, mailer, clock, report=report)

    assert (report.claimed, report.outcomes, report.released) == (
        THRESHOLD,
        {"retry_scheduled": THRESHOLD},
        0,
    )


def test_a_rejection_of_every_payload_stops_the_run_but_stays_permanent(clock):
    ledger, mailer = revoked(clock, REJECTED)

    with pytest.raises(BreakerOpen, match="http:422:validation_error"):
        run(ledger, mailer, clock)

    assert mailer.sends == THRESHOLD
    assert ledger.state_counts(W42) == {
        DeliveryState.FAILED: THRESHOLD,
        DeliveryState.PENDING: CUSTOMERS - THRESHOLD,
    }


def test_once_the_key_is_fixed_the_next_run_delivers_everyone_once(clock):
    ledger, provider = frozen_ledger(CUSTOMERS), FakeMailer(clock=clock)
    mailer = SystemicFailureMailer(provider, BAD_KEY)
    with pytest.raises(BreakerOpen):
        run(ledger, mailer, clock)

    mailer.failing = None
    clock.advance(timedelta(hours=2))  # past every retry's backoff
    report = run(ledger, mailer, clock)

    assert report.outcomes == {"sent": CUSTOMERS}
    assert ledger.state_counts(W42) == {DeliveryState.SENT: CUSTOMERS}
    assert all(provider.deliveries_for(key_of(n)) == 1 for n in range(1, CUSTOMERS + 1))


def test_failures_that_a_success_interrupts_never_open_the_breaker(clock):
    ledger, inner = frozen_ledger(CUSTOMERS), FakeMailer(clock=clock)
    for n in range(1, CUSTOMERS + 1, 2):  # every other customer bounces
        inner.script(key_of(n), SendOutcome.failed(FailureClass.PERMANENT, "smtp:550:5.7.1"))

    report = deliver_due(
        make_deliverer(ledger, inner, clock),
        batch_size=50,
        concurrency=4,
        breaker_threshold=2,
    )

    assert report.outcomes == {"sent": CUSTOMERS // 2, "failed": CUSTOMERS // 2}


def test_failures_with_different_codes_are_not_one_streak(clock):
    ledger, inner = frozen_ledger(30), FakeMailer(clock=clock)
    for n in range(1, 31):
        code = "smtp:421" if n % 2 else "smtp:451"
        inner.script(key_of(n), SendOutcome.failed(FailureClass.TRANSIENT, code))

    report = deliver_due(
        make_deliverer(ledger, inner, clock), batch_size=50, concurrency=1, breaker_threshold=2
    )

    assert report.outcomes == {"retry_scheduled": 30}


def test_no_threshold_means_no_breaker(clock):
    ledger, mailer = revoked(clock, REJECTED)

    report = deliver_due(
        make_deliverer(ledger, mailer, clock), batch_size=50, concurrency=4, breaker_threshold=0
    )

    assert report.outcomes == {"failed": CUSTOMERS}


def test_a_sweep_stops_delivering_says_why_and_still_cleans(clock):
    ledger, mailer = revoked(clock)
    [sent] = ledger.claim_due(clock.now(), "w-before", timedelta(minutes=2), limit=1)
    ticket = start_one(ledger, sent, clock.now())
    complete_one(
        ledger,
        ticket,
        SendOutcome.sent("pm-1"),
        Transition(sent.key, DeliveryState.CLAIMED, sent.token, DeliveryState.SENT, clock.now()),
    )

    report = sweep(
        make_deliverer(ledger, mailer, clock),
        batch_size=50,
        concurrency=4,
        cleanup_mode=CleanupMode.ARCHIVE,
        breaker_threshold=THRESHOLD,
    )

    assert report.stopped is not None
    assert "http:401:invalid_api_key" in report.stopped
    assert mailer.sends == THRESHOLD
    assert report.cleaned[W42].cleaned == 1


class RevokedMidRun(SystemicFailureMailer):
    """Sends `good` messages, then answers 401 to every send (the key revoked during the run)."""

    def __init__(self, inner: FakeMailer, good: int) -> None:
        super().__init__(inner)
        self._good = good

    def send(self, message, *, idempotency_key):
        with self._lock:
            if self._sends.total() >= self._good:
                self.failing = BAD_KEY
        return super().send(message, idempotency_key=idempotency_key)


@pytest.mark.parametrize("good", [40, 70, 130])
@pytest.mark.parametrize("claim", [400, 100, 70])
def test_a_key_revoked_mid_run_stops_it_with_every_claim_recorded_or_given_back(clock, good, claim):
    # at concurrency 64 the next wave is composed while four are sending: when the breaker opens
    # on a wave's outcomes, that composed wave is never started and its claims go back due; with
    # claims smaller than the period, a run over a database server has the next claim taken
    # ahead, on its claim thread, when the breaker opens, and gives that one back too
    ledger, provider = frozen_ledger(400), FakeMailer(clock=clock)
    mailer = RevokedMidRun(provider, good)
    report = DeliveryReport()

    with pytest.raises(BreakerOpen, match="http:401"):
        run(ledger, mailer, clock, concurrency=64, batch_size=claim, report=report)

    items = ledger.items(W42)
    assert all(i.state is not DeliveryState.CLAIMED for i in items)  # none left leased
    sent = [i for i in items if i.state is DeliveryState.SENT]
    assert len(sent) == good
    assert all(provider.deliveries_for(i.key) == 1 for i in sent)
    failed = [i for i in items if i.state is not DeliveryState.SENT and i.attempts]
    assert all(i.last_detail == BAD_KEY.detail for i in failed)
    assert THRESHOLD <= len(failed) <= 64  # a failure that starts mid-run: at most max(20, 64)
    assert mailer.sends == good + len(failed)
    # every other item is due again with no attempt, whether it was claimed or not
    rest = [i for i in items if not i.attempts]
    assert len(rest) == 400 - good - len(failed)
    assert all(i.state in (DeliveryState.PENDING, DeliveryState.RETRY_SCHEDULED) for i in rest)
    assert all(i.next_attempt_at is None or i.next_attempt_at <= clock.now() for i in rest)
    assert report.claimed == good + len(failed) + report.released
