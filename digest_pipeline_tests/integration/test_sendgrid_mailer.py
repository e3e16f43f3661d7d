"""The SendGrid mailer against a real HTTP server on loopback (no PostgreSQL: default suite).

Every row of the mailer's fault table maps to its failure class; a send whose answer is lost is
`unknown`, and reconciliation never sends it again (SendGrid has no idempotency key): the server
holds exactly one message for the key. Assertions are about messages per key at the server.
"""

import functools
import logging
import time
from collections.abc import Iterator
from datetime import timedelta

import httpx
import pytest

from digest_pipeline.adapters.mail.sendgrid import SendGridMailer
from digest_pipeline.domain.breaker import credentials_refused
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.rigs.servers.loopback import free_port
from digest_pipeline.rigs.servers.provider_actions import (
    Action,
    malformed_success,
    status,
    store_then_drop,
    store_then_hang,
)
from digest_pipeline.rigs.servers.sendgrid_server import SendGridServer
from digest_pipeline.services.deliver import deliver_due
from digest_pipeline.services.reconcile import reconcile_period
from digest_pipeline.settings import ProviderSettings
from digest_pipeline_tests.builders import email_of, key_of, make_deliverer, seed_period, state_of
from digest_pipeline_tests.conftest import T0, W42
from digest_pipeline_tests.fakes import FakeLedger, FixedClock
from digest_pipeline_tests.integration.provider_messages import DATE_HEADER, send
from digest_pipeline_tests.integration.provider_messages import message as provider_message

TIMEOUT = 0.4
POLICY = DeliveryPolicy()

#: a named sender, and headers SendGrid stamps itself (`Date`) beside one it must carry
message = functools.partial(
    provider_message,
    sender="Linden Home <digest@example.com>",
    extra=(DATE_HEADER, ("List-Unsubscribe-Post", "List-Unsubscribe=One-Click")),
)


def settings_for(url: str, api_key: str) -> ProviderSettings:
    # SendGrid has no idempotency window; the field is not read by its mailer
    return ProviderSettings(
        url=url, api_key=api_key, timeout_seconds=TIMEOUT, idempotency_window=timedelta(0)
    )


@pytest.fixture
def server() -> Iterator[SendGridServer]:
    with SendGridServer() as provider:
        yield provider
        assert provider.handler_errors == 0


@pytest.fixture
def mailer(server: SendGridServer) -> Iterator[SendGridMailer]:
    with SendGridMailer(settings_for(server.url, server.api_key)) as m:
        yield m


class TestFaultTable:
    def test_202_is_sent_with_the_x_message_id(
        self, server: SendGridServer, mailer: SendGridMailer
    ) -> None:
        outcome = send(mailer, message())
        assert outcome == SendOutcome.sent(server.message_id(key_of(1)))
        assert outcome.provider_message_id is not None
        assert server.delivered_count(key_of(1)) == 1

    def test_202_without_an_id_is_still_sent(
        self, server: SendGridServer, mailer: SendGridMailer
    ) -> None:
        server.script(key_of(1), malformed_success())
        assert send(mailer, message()) == SendOutcome.sent(None)
        assert server.delivered_count(key_of(1)) == 1

    @pytest.mark.parametrize(
        ("action", "failure", "detail"),
        [
            (
                status(400, "personalizations.0.to.0.email"),
                FailureClass.PERMANENT,
                "sendgrid:400:personalizations.0.to.0.email",
            ),
            (status(400), FailureClass.PERMANENT, "sendgrid:400"),
            (status(401), FailureClass.PERMANENT, "sendgrid:401"),
            (status(403, "from"), FailureClass.PERMANENT, "sendgrid:403:from"),
            (status(413), FailureClass.PERMANENT, "sendgrid:413"),
            (status(404), FailureClass.PERMANENT, "sendgrid:404"),
            (status(429), FailureClass.THROTTLED, "sendgrid:429"),
            (status(408), FailureClass.TRANSIENT, "sendgrid:408"),
            (status(500), FailureClass.TRANSIENT, "sendgrid:500"),
            (status(502), FailureClass.TRANSIENT, "sendgrid:502"),
            (status(503), FailureClass.TRANSIENT, "sendgrid:503"),
            # accepted, then the answer was lost: it may go out; never resent blindly
            (store_then_hang(), FailureClass.UNKNOWN, "sendgrid:read_timeout"),
            (store_then_drop(), FailureClass.UNKNOWN, "sendgrid:remote_protocol_error"),
        ],
    )
    def test_answer_maps_to_failure_class(
        self,
        server: SendGridServer,
        mailer: SendGridMailer,
        action: Action,
        failure: FailureClass,
        detail: str,
    ) -> None:
        server.script(key_of(1), action)
        outcome = send(mailer, message())
        assert (outcome.accepted, outcome.failure_class, outcome.detail) == (False, failure, detail)
        stored = 1 if failure is FailureClass.UNKNOWN else 0
        assert server.delivered_count(key_of(1)) == stored

    def test_a_refusal_never_echoes_sendgrids_free_text(
        self, server: SendGridServer, mailer: SendGridMailer
    ) -> None:
        server.script(key_of(1), status(400, "the field has spaces: and free text"))
        assert send(mailer, message()).detail == "sendgrid:400"

    def test_429_honours_x_ratelimit_reset(
        self, server: SendGridServer, mailer: SendGridMailer
    ) -> None:
        server.script(key_of(1), status(429, retry_after=30))
        outcome = send(mailer, message())
        assert outcome.failure_class is FailureClass.THROTTLED
        assert outcome.retry_after is not None
        # the reset is whole seconds on the server's clock, read against the answer's Date
        assert timedelta(seconds=27) <= outcome.retry_after <= timedelta(seconds=32)

    @pytest.mark.parametrize(
        ("headers", "expected"),
        [
            (
                {"X-RateLimit-Reset": "1792389630", "Date": "Mon, 19 Oct 2026 06:00:00 GMT"},
                timedelta(seconds=30),
            ),
            (
                {"X-RateLimit-Reset": "1792389570", "Date": "Mon, 19 Oct 2026 06:00:00 GMT"},
                timedelta(0),
            ),
            (
                {"X-RateLimit-Reset": "9" * 12, "Date": "Mon, 19 Oct 2026 06:00:00 GMT"},
                timedelta(days=1),
            ),
            ({"X-RateLimit-Reset": "soon", "Retry-After": "12"}, timedelta(seconds=12)),
            ({}, None),
        ],
        ids=["ahead", "passed", "absurd", "retry-after", "none"],
    )
    def test_rate_limit_reset_is_read_against_the_answers_date(
        self, headers: dict[str, str], expected: timedelta | None
    ) -> None:
        def throttle(request: httpx.Request) -> httpx.Response:
            return httpx.Response(429, headers=headers, json={"errors": []})

        settings = settings_for("http://sendgrid.invalid", "k")
        with SendGridMailer(settings, transport=httpx.MockTransport(throttle)) as m:
            outcome = send(m, message())
        assert (outcome.failure_class, outcome.retry_after) == (FailureClass.THROTTLED, expected)

    def test_wrong_api_key_is_a_credential_refusal(self, server: SendGridServer) -> None:
        with SendGridMailer(settings_for(server.url, "SG.wrong.key")) as m:
            outcome = send(m, message())
        assert (outcome.failure_class, outcome.detail) == (FailureClass.PERMANENT, "sendgrid:401")
        assert server.stored == {}

    @pytest.mark.parametrize("code", [401, 403])
    def test_the_breaker_reads_401_and_403_as_credential_refusals(self, code: int) -> None:
        def refuse(request: httpx.Request) -> httpx.Response:
            return httpx.Response(code, json={"errors": [{"message": "x", "field": None}]})

        settings = settings_for("http://sendgrid.invalid", "k")
        with SendGridMailer(settings, transport=httpx.MockTransport(refuse)) as m:
            assert credentials_refused(send(m, message()))

    def test_closed_port_is_transient(self) -> None:
        with SendGridMailer(settings_for(f"http://127.0.0.1:{free_port()}", "k")) as m:
            outcome = send(m, message())
        assert (outcome.failure_class, outcome.detail) == (
            FailureClass.TRANSIENT,
            "sendgrid:connect_error",
        )

    @pytest.mark.parametrize(
        ("error", "failure"),
        [
            (httpx.ConnectTimeout("t"), FailureClass.TRANSIENT),
            (httpx.PoolTimeout("t"), FailureClass.TRANSIENT),
            (httpx.UnsupportedProtocol("t"), FailureClass.TRANSIENT),
            (httpx.WriteTimeout("t"), FailureClass.UNKNOWN),
            (httpx.ReadError("t"), FailureClass.UNKNOWN),
        ],
    )
    def test_transport_errors(self, error: Exception, failure: FailureClass) -> None:
        def fail(request: httpx.Request) -> httpx.Response:
            raise error

        settings = settings_for("http://sendgrid.invalid", "k")
        with SendGridMailer(settings, transport=httpx.MockTransport(fail)) as m:
            assert send(m, message()).failure_class is failure

    def test_mismatched_key_is_refused_before_any_request(
        self, server: SendGridServer, mailer: SendGridMailer
    ) -> None:
        outcome = mailer.send(message(1), idempotency_key=str(key_of(2)))
        assert (outcome.failure_class, server.requests) == (FailureClass.PERMANENT, 0)


class TestRequest:
    def test_request_follows_sendgrids_v3_body(
        self, server: SendGridServer, mailer: SendGridMailer
    ) -> None:
        assert send(mailer, message(7)).accepted
        [request] = server.received
        assert request.path == "/v3/mail/send"
        assert request.headers["Authorization"] == f"Bearer {server.api_key}"
        assert request.body == {
            "personalizations": [{"to": [{"email": email_of(7)}]}],
            "from": {"email": "digest@example.com", "name": "Linden Home"},
            "subject": "Your weekly picks (2026-W42)",
            "content": [
                {"type": "text/plain", "value": "Your picks"},
                {"type": "text/html", "value": "<p>Your picks</p>"},
            ],
            # no Date (SendGrid stamps it), no Message-ID (SendGrid may replace it)
            "headers": {
                "X-Digest-Operation-Key": "digest:2026-W42:customer-0007",
                "List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
            },
            "custom_args": {"operation_key": "digest:2026-W42:customer-0007"},
            "tracking_settings": {
                "click_tracking": {"enable": False, "enable_text": False},
                "open_tracking": {"enable": False},
                "subscription_tracking": {"enable": False},
            },
        }

    def test_every_request_carries_its_key_in_custom_args(
        self, server: SendGridServer, mailer: SendGridMailer
    ) -> None:
        server.script(key_of(2), status(500))
        server.script(key_of(3), status(429))
        for n in (1, 2, 3, 2):
            send(mailer, message(n))
        keys = [r.body["custom_args"]["operation_key"] for r in server.received]
        assert keys == [str(key_of(n)) for n in (1, 2, 3, 2)]

    def test_text_only_message_has_one_content_part(
        self, server: SendGridServer, mailer: SendGridMailer
    ) -> None:
        send(mailer, message(html=None))
        assert server.received[0].body["content"] == [{"type": "text/plain", "value": "Your picks"}]

    def test_capabilities_promise_no_idempotency_and_no_lookup(self) -> None:
        mailer = SendGridMailer(settings_for("http://sendgrid.invalid", "k"))
        capabilities = mailer.capabilities
        assert (capabilities.idempotency_window, capabilities.can_lookup) == (None, False)
        other_account = SendGridMailer(settings_for("http://sendgrid.invalid", "k2"))
        assert mailer.identity.startswith("sendgrid:")
        assert mailer.identity != other_account.identity


class TestReconciliation:
    def test_a_lost_answer_stays_unknown_and_is_never_resent(self, server: SendGridServer) -> None:
        ledger = FakeLedger()
        clock = FixedClock(T0)
        keys = seed_period(ledger, 3)
        server.script(keys[0], store_then_hang(seconds=2 * TIMEOUT + 1))
        with SendGridMailer(settings_for(server.url, server.api_key)) as mailer:
            deliverer = make_deliverer(ledger, mailer, clock, policy=POLICY)
            report = deliver_due(deliverer, batch_size=10, concurrency=3)
            assert report.outcomes == {"sent": 2, "unknown": 1}
            for later in (timedelta(minutes=5), timedelta(hours=30)):
                clock.advance(later)
                reconciled = reconcile_period(ledger, mailer, clock, POLICY, W42)
                assert reconciled.still_unknown == 1
                deliver_due(deliverer, batch_size=10, concurrency=1)
        assert state_of(ledger, keys[0]) is DeliveryState.UNKNOWN
        assert [server.delivered_count(k) for k in keys] == [1, 1, 1]
        assert all(r.passed for r in ledger.check_invariants(W42, clock.now()))


class TestSecrets:
    def test_api_key_and_address_never_reach_logs_or_details(
        self, server: SendGridServer, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.DEBUG)
        server.script(key_of(2), status(500))
        server.script(key_of(3), store_then_hang())
        with SendGridMailer(settings_for(server.url, server.api_key)) as m:
            outcomes = [send(m, message(n)) for n in (1, 2, 3)]
        with SendGridMailer(settings_for(server.url, "SG.wrong.key")) as m:
            outcomes.append(send(m, message(4)))
        with SendGridMailer(settings_for(f"http://127.0.0.1:{free_port()}", server.api_key)) as m:
            outcomes.append(send(m, message(5)))
        assert [o.label for o in outcomes] == [
            "sent",
            "transient",
            "unknown",
            "permanent",
            "transient",
        ]
        assert {"digest_pipeline.adapters.sendgrid", "httpx"} <= {r.name for r in caplog.records}
        for text in [r.getMessage() for r in caplog.records] + [repr(o) for o in outcomes]:
            assert server.api_key not in text
            assert "SG.wrong.key" not in text
            assert "@mailbox.example" not in text

    def test_mailer_repr_and_settings_repr_hide_the_api_key(self, server: SendGridServer) -> None:
        settings = settings_for(server.url, server.api_key)
        assert server.api_key not in repr(settings)
        assert server.api_key not in repr(SendGridMailer(settings).__dict__)

    def test_construction_and_prepare_do_no_io(self) -> None:
        calls: list[httpx.Request] = []

        def record(request: httpx.Request) -> httpx.Response:
            calls.append(request)
            return httpx.Response(202)

        settings = settings_for("http://unreachable.invalid:9", "k")
        mailer = SendGridMailer(settings, transport=httpx.MockTransport(record))
        mailer.prepare()
        mailer.close()
        assert calls == []


def test_hang_is_past_the_clients_timeout() -> None:
    """The rig's own promise: a hang outlasts the client, so the timeout is what ends it."""
    with SendGridServer() as server, SendGridMailer(settings_for(server.url, server.api_key)) as m:
        server.script(key_of(1), store_then_hang(seconds=5))
        started = time.monotonic()
        assert send(m, message()).failure_class is FailureClass.UNKNOWN
        assert time.monotonic() - started < 2.0
