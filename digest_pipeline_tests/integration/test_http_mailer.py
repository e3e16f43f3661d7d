"""The HTTP provider mailer against a real HTTP server on loopback (no PostgreSQL: default suite).

Every provider answer and transport fault maps to its failure class; the provider's idempotency
keys make a reconciliation resend inside the window end `sent` with exactly one stored message.
"""

import logging
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest

from digest_pipeline.adapters.mail.http import HttpProviderMailer
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import Message, message_id_for
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.rigs.servers.loopback import free_port
from digest_pipeline.rigs.servers.provider_actions import (
    Action,
    conflict_concurrent,
    hold,
    malformed_success,
    quota,
    status,
    store_then_drop,
    store_then_hang,
)
from digest_pipeline.rigs.servers.provider_server import ProviderServer
from digest_pipeline.services.deliver import deliver_due
from digest_pipeline.services.reconcile import reconcile_period
from digest_pipeline.settings import ProviderSettings
from digest_pipeline_tests.builders import email_of, key_of, make_deliverer, seed_period, state_of
from digest_pipeline_tests.conftest import T0, W42
from digest_pipeline_tests.fakes import FakeLedger, FixedClock
from digest_pipeline_tests.integration.provider_messages import message, send

#: the client's timeouts: long enough for loopback, short enough that a hang costs little
TIMEOUT = 0.4
WINDOW = timedelta(hours=24)
POLICY = DeliveryPolicy()


def settings_for(url: str, api_key: str, *, timeout: float = TIMEOUT) -> ProviderSettings:
    return ProviderSettings(
        url=url, api_key=api_key, timeout_seconds=timeout, idempotency_window=WINDOW
    )


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    with ProviderServer() as provider:
        yield provider
        assert provider.handler_errors == 0


@pytest.fixture
def mailer(server: ProviderServer) -> Iterator[HttpProviderMailer]:
    with HttpProviderMailer(settings_for(server.url, server.api_key)) as m:
        yield m


class TestFailureClasses:
    @pytest.mark.parametrize(
        ("action", "failure", "detail"),
        [
            # throttling: retried at the provider's pace
            (
                status(429, "rate_limit_exceeded"),
                FailureClass.THROTTLED,
                "http:429:rate_limit_exceeded",
            ),
            (status(429), FailureClass.THROTTLED, "http:429:error"),
            # quota spent: nothing left and the customer is not at fault; every sender
            # pauses (the quota flag, asserted below), the item waits
            (quota(), FailureClass.THROTTLED, "http:429:daily_quota_exceeded"),
            (
                status(429, "monthly_quota_exceeded"),
                FailureClass.THROTTLED,
                "http:429:monthly_quota_exceeded",
            ),
            # same key, other payload: a bug; a concurrent request with the key: try again
            (
                status(409, "invalid_idempotent_request"),
                FailureClass.PERMANENT,
                "http:409:invalid_idempotent_request",
            ),
            (
                conflict_concurrent(),
                FailureClass.TRANSIENT,
                "http:409:concurrent_idempotent_requests",
            ),
            (status(409, "conflict"), FailureClass.PERMANENT, "http:409:conflict"),
            # the request is wrong, or we are not allowed: retrying cannot help
            (status(400, "validation_error"), FailureClass.PERMANENT, "http:400:validation_error"),
            (status(401, "missing_api_key"), FailureClass.PERMANENT, "http:401:missing_api_key"),
            (status(403, "invalid_api_key"), FailureClass.PERMANENT, "http:403:invalid_api_key"),
            (status(404, "not_found"), FailureClass.PERMANENT, "http:404:not_found"),
            (
                status(422, "invalid_from_address"),
                FailureClass.PERMANENT,
                "http:422:invalid_from_address",
            ),
            # the provider gave up reading the request: nothing was processed
            (status(408, "request_timeout"), FailureClass.TRANSIENT, "http:408:request_timeout"),
            # the provider failed: its idempotency makes a retry with the same key safe
            (
                status(500, "internal_server_error"),
                FailureClass.TRANSIENT,
                "http:500:internal_server_error",
            ),
            (status(502, "bad_gateway"), FailureClass.TRANSIENT, "http:502:bad_gateway"),
            (
                status(503, "service_unavailable"),
                FailureClass.TRANSIENT,
                "http:503:service_unavailable",
            ),
            (status(504, "gateway_timeout"), FailureClass.TRANSIENT, "http:504:gateway_timeout"),
            # the provider stored the message but we never heard: may have been sent
            (store_then_hang(), FailureClass.UNKNOWN, "http:read_timeout"),
            (store_then_drop(), FailureClass.UNKNOWN, "http:remote_protocol_error"),
            (malformed_success(), FailureClass.UNKNOWN, "http:200:malformed_body"),
        ],
    )
    def test_provider_answer_maps_to_failure_class(
        self,
        server: ProviderServer,
        mailer: HttpProviderMailer,
        action: Action,
        failure: FailureClass,
        detail: str,
    ) -> None:
        server.script(key_of(1), action)
        outcome = send(mailer, message())
        assert (outcome.accepted, outcome.failure_class, outcome.detail) == (False, failure, detail)
        assert outcome.quota == detail.endswith("_quota_exceeded")

    def test_success_is_sent_with_the_provider_id(
        self, server: ProviderServer, mailer: HttpProviderMailer
    ) -> None:
        outcome = send(mailer, message())
        assert outcome == SendOutcome.sent(server.message_id(key_of(1)))
        assert outcome.provider_message_id is not None

    def test_wrong_api_key_is_permanent(self, server: ProviderServer) -> None:
        with HttpProviderMailer(settings_for(server.url, "re_wrong_key")) as m:
            outcome = send(m, message())
        assert (outcome.failure_class, outcome.detail) == (
            FailureClass.PERMANENT,
            "http:401:invalid_api_key",
        )
        assert server.stored == {}

    def test_closed_port_is_transient(self) -> None:
        with HttpProviderMailer(settings_for(f"http://127.0.0.1:{free_port()}", "k")) as m:
            outcome = send(m, message())
        assert (outcome.failure_class, outcome.detail) == (
            FailureClass.TRANSIENT,
            "http:connect_error",
        )

    @pytest.mark.parametrize(
        ("error", "failure"),
        [
            (httpx.ConnectTimeout("t"), FailureClass.TRANSIENT),
            (httpx.PoolTimeout("t"), FailureClass.TRANSIENT),
            (httpx.ProxyError("t"), FailureClass.TRANSIENT),
            (httpx.UnsupportedProtocol("t"), FailureClass.TRANSIENT),
            (httpx.InvalidURL("t"), FailureClass.TRANSIENT),
            (httpx.LocalProtocolError("t"), FailureClass.UNKNOWN),
            (httpx.WriteTimeout("t"), FailureClass.UNKNOWN),
            (httpx.ReadError("t"), FailureClass.UNKNOWN),
            (httpx.WriteError("t"), FailureClass.UNKNOWN),
        ],
    )
    def test_transport_errors_that_a_real_server_cannot_produce_on_demand(
        self, error: Exception, failure: FailureClass
    ) -> None:
        def fail(request: httpx.Request) -> httpx.Response:
            raise error

        settings = settings_for("http://provider.invalid", "k")
        with HttpProviderMailer(settings, transport=httpx.MockTransport(fail)) as m:
            outcome = send(m, message())
        assert outcome.failure_class is failure

    def test_mismatched_idempotency_key_is_refused_before_any_request(
        self, server: ProviderServer, mailer: HttpProviderMailer
    ) -> None:
        outcome = mailer.send(message(1), idempotency_key=str(key_of(2)))
        assert (outcome.failure_class, server.requests) == (FailureClass.PERMANENT, 0)

    @pytest.mark.parametrize(
        "bad",
        [
            message(extra=(("X-Note", "hi\r\nBcc: x@evil.example"),)),
            message(extra=(("X-Note", "hi\u2028Bcc: x@evil.example"),)),
            message(extra=(("X Note", "a header name holding a space"),)),
            # httpx would fail to encode the JSON body: an exception, read as `unknown`
            message(html="<p>\ud800</p>"),
        ],
        ids=["crlf", "unicode-line-break", "bad-header-name", "lone-surrogate"],
    )
    def test_what_no_mailer_may_send_is_refused_before_any_request(
        self, server: ProviderServer, mailer: HttpProviderMailer, bad: Message
    ) -> None:
        outcome = send(mailer, bad)
        assert (outcome.failure_class, outcome.detail, server.requests) == (
            FailureClass.PERMANENT,
            "render_error",
            0,
        )


class TestRequest:
    def test_request_carries_auth_key_and_the_resend_body(
        self, server: ProviderServer, mailer: HttpProviderMailer
    ) -> None:
        send(mailer, message(7, extra=(("Date", "Mon, 19 Oct 2026 06:00:00 +0000"),)))
        [request] = server.received
        assert request.path == "/emails"
        assert request.headers["Authorization"] == f"Bearer {server.api_key}"
        assert request.headers["Idempotency-Key"] == "digest:2026-W42:customer-0007"
        assert request.body == {
            "from": "digest@example.com",
            "to": [email_of(7)],
            "subject": "Your weekly picks (2026-W42)",
            "html": "<p>Your picks</p>",
            "text": "Your picks",
            # no Date: the provider stamps its own, and one per attempt would break replays
            "headers": {
                "Message-ID": message_id_for(key_of(7)),
                "X-Digest-Operation-Key": "digest:2026-W42:customer-0007",
            },
            "tags": [
                {"name": "operation_key", "value": "digest_2026-W42_customer-0007"},
                {"name": "period", "value": "2026-W42"},
            ],
        }

    def test_text_only_message_has_no_html_field(
        self, server: ProviderServer, mailer: HttpProviderMailer
    ) -> None:
        send(mailer, message(html=None))
        assert "html" not in server.received[0].body

    def test_one_pooled_connection_serves_consecutive_sends(
        self, server: ProviderServer, mailer: HttpProviderMailer
    ) -> None:
        outcomes = [send(mailer, message(n)) for n in (1, 2, 3)]
        assert all(o.accepted for o in outcomes)
        assert server.connections_opened == 1


class TestRetryAfter:
    ANSWERED = datetime(2026, 10, 19, 6, 0, tzinfo=UTC)

    @pytest.mark.parametrize(
        ("retry_after", "expected"),
        [
            (30, timedelta(seconds=30)),
            ("0", timedelta(0)),
            # an HTTP-date counts from the response's Date, not from our clock
            (format_datetime(ANSWERED + timedelta(seconds=90), usegmt=True), timedelta(seconds=90)),
            (format_datetime(ANSWERED - timedelta(seconds=90), usegmt=True), timedelta(0)),
            # absurd waits are capped so the schedule stays in range
            ("99999999", timedelta(days=1)),
            ("soon", None),
            ("-5", None),
            ("", None),
            (None, None),
        ],
    )
    def test_throttle_honours_retry_after(
        self,
        server: ProviderServer,
        mailer: HttpProviderMailer,
        retry_after: int | str | None,
        expected: timedelta | None,
    ) -> None:
        date = format_datetime(self.ANSWERED, usegmt=True)
        server.script(key_of(1), status(429, "rate_limit_exceeded", retry_after, date))
        outcome = send(mailer, message())
        assert (outcome.failure_class, outcome.retry_after) == (FailureClass.THROTTLED, expected)


class TestIdempotency:
    def test_same_key_twice_gives_the_same_id_and_one_stored_message(
        self, server: ProviderServer, mailer: HttpProviderMailer
    ) -> None:
        first, second = send(mailer, message()), send(mailer, message())
        assert first.accepted
        assert second.accepted
        assert first.provider_message_id == second.provider_message_id
        assert (server.delivered_count(key_of(1)), server.replays(key_of(1))) == (1, 1)

    def test_same_key_other_payload_is_permanent_and_logged_as_a_bug(
        self,
        server: ProviderServer,
        mailer: HttpProviderMailer,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        send(mailer, message())
        with caplog.at_level(logging.ERROR, logger="digest_pipeline.adapters.http"):
            outcome = send(mailer, message(html="<p>changed</p>"))
        assert outcome.failure_class is FailureClass.PERMANENT
        assert [r.levelno for r in caplog.records] == [logging.ERROR]
        assert str(key_of(1)) in caplog.records[0].getMessage()
        assert server.delivered_count(key_of(1)) == 1

    def test_a_send_while_the_key_is_in_flight_is_transient(
        self, server: ProviderServer, mailer: HttpProviderMailer
    ) -> None:
        server.script(key_of(1), hold())
        first: list[SendOutcome] = []
        sender = threading.Thread(target=lambda: first.append(send(mailer, message())))
        sender.start()
        try:
            assert server.wait_in_flight(key_of(1))
            second = send(mailer, message())
        finally:
            server.release(key_of(1))
            sender.join()
        assert (second.failure_class, second.detail) == (
            FailureClass.TRANSIENT,
            "http:409:concurrent_idempotent_requests",
        )
        assert first[0].accepted
        assert server.delivered_count(key_of(1)) == 1

    def test_hang_after_storing_is_unknown_and_the_provider_has_the_message(
        self, server: ProviderServer, mailer: HttpProviderMailer
    ) -> None:
        server.script(key_of(1), store_then_hang())
        assert send(mailer, message()).failure_class is FailureClass.UNKNOWN
        assert server.delivered_count(key_of(1)) == 1

    def test_provider_forgets_a_key_after_its_window(self) -> None:
        now = [0.0]
        with (
            ProviderServer(window_seconds=60, clock=lambda: now[0]) as provider,
            HttpProviderMailer(settings_for(provider.url, provider.api_key)) as m,
        ):
            send(m, message())
            now[0] = 60.0
            send(m, message())
            assert provider.delivered_count(key_of(1)) == 2


class TestReconciliation:
    def run(
        self, server: ProviderServer, clock: FixedClock
    ) -> tuple[FakeLedger, HttpProviderMailer]:
        """Three customers delivered; customer 1's send was stored by the provider, then hung."""
        ledger = FakeLedger()
        keys = seed_period(ledger, 3)
        server.script(keys[0], store_then_hang())
        mailer = HttpProviderMailer(settings_for(server.url, server.api_key))
        deliverer = make_deliverer(ledger, mailer, clock, policy=POLICY)
        report = deliver_due(deliverer, batch_size=10, concurrency=3)
        assert report.outcomes == {"sent": 2, "unknown": 1}
        assert state_of(ledger, keys[0]) is DeliveryState.UNKNOWN
        assert server.delivered_count(keys[0]) == 1
        return ledger, mailer

    def test_resend_inside_the_window_ends_sent_with_one_stored_message(
        self, server: ProviderServer
    ) -> None:
        clock = FixedClock(T0)
        ledger, mailer = self.run(server, clock)
        with mailer:
            clock.advance(timedelta(minutes=5))
            report = reconcile_period(ledger, mailer, clock, POLICY, W42)
            assert report.evidence == {"idempotent_resend": 1}
            deliver_due(
                make_deliverer(ledger, mailer, clock, policy=POLICY), batch_size=10, concurrency=1
            )
        item = ledger.get(key_of(1))
        assert item is not None
        assert (item.state, item.provider_message_id) == (
            DeliveryState.SENT,
            server.message_id(key_of(1)),
        )
        assert (server.delivered_count(key_of(1)), server.replays(key_of(1))) == (1, 1)
        assert [len(v) for v in server.stored.values()] == [1, 1, 1]
        assert all(r.passed for r in ledger.check_invariants(W42, clock.now()))

    def test_outside_the_window_the_item_stays_unknown(self, server: ProviderServer) -> None:
        clock = FixedClock(T0)
        ledger, mailer = self.run(server, clock)
        with mailer:
            item = ledger.get(key_of(1))
            assert item is not None
            assert item.first_attempt_at is not None
            clock.set(item.first_attempt_at + WINDOW + timedelta(seconds=1))
            report = reconcile_period(ledger, mailer, clock, POLICY, W42)
            deliver_due(
                make_deliverer(ledger, mailer, clock, policy=POLICY), batch_size=10, concurrency=1
            )
        assert report.still_unknown == 1
        assert state_of(ledger, key_of(1)) is DeliveryState.UNKNOWN
        assert server.delivered_count(key_of(1)) == 1
        assert all(r.passed for r in ledger.check_invariants(W42, clock.now()))


class TestSecrets:
    def test_api_key_and_address_never_reach_logs_or_details(
        self, server: ProviderServer, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.DEBUG)
        server.script(key_of(2), status(500, "internal_server_error"))
        server.script(key_of(3), store_then_hang())
        with HttpProviderMailer(settings_for(server.url, server.api_key)) as m:
            outcomes = [send(m, message(n)) for n in (1, 2, 3)]
            send(m, message(1, html="<p>changed</p>"))
        with HttpProviderMailer(settings_for(server.url, "re_wrong_key")) as m:
            outcomes.append(send(m, message(4)))
        assert [o.label for o in outcomes] == ["sent", "transient", "unknown", "permanent"]
        assert {"digest_pipeline.adapters.http", "httpx"} <= {r.name for r in caplog.records}
        for text in [r.getMessage() for r in caplog.records] + [o.detail for o in outcomes]:
            assert server.api_key not in text
            assert "re_wrong_key" not in text
            assert "@mailbox.example" not in text

    def test_settings_repr_hides_the_api_key(self, server: ProviderServer) -> None:
        assert server.api_key not in repr(settings_for(server.url, server.api_key))

    @staticmethod
    def _recording_mailer() -> tuple[HttpProviderMailer, list[httpx.Request]]:
        """A mailer of an unresolvable host whose transport records every request it gets."""
        calls: list[httpx.Request] = []

        def record(request: httpx.Request) -> httpx.Response:
            calls.append(request)
            return httpx.Response(200, json={"id": "x"})

        settings = settings_for("http://unreachable.invalid:9", "k")
        return HttpProviderMailer(settings, transport=httpx.MockTransport(record)), calls

    def test_construction_does_no_io(self) -> None:
        mailer, calls = self._recording_mailer()
        assert mailer.capabilities.idempotency_window == WINDOW
        assert not mailer.capabilities.can_lookup
        mailer.close()
        assert calls == []
        # nor without a transport: an unresolvable host is only looked up on the first send
        HttpProviderMailer(settings_for("http://unreachable.invalid:9", "k")).close()

    def test_prepare_builds_the_client_and_sends_nothing(self) -> None:
        mailer, calls = self._recording_mailer()
        mailer.prepare()
        assert mailer._client is not None
        assert calls == []
        mailer.close()
        # an unresolvable host is not looked up either
        unresolvable = HttpProviderMailer(settings_for("http://unreachable.invalid:9", "k"))
        unresolvable.prepare()
        unresolvable.close()
