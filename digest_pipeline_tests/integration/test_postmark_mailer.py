"""The Postmark mailer against a loopback server speaking Postmark's API (no PostgreSQL needed).

Every Postmark answer and transport fault maps to its failure class. Postmark has no idempotency
key, so a lost answer is `unknown` and reconciliation settles it by searching the key's
Metadata: a message Postmark holds is `sent` without a second send, one it never took is sent
again once; either way Postmark ends with exactly one message for the key.
"""

import functools
import logging
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from digest_pipeline.adapters.mail.postmark import LOOKUP_LAG, PostmarkMailer, metadata_value
from digest_pipeline.domain.breaker import as_retryable, credentials_refused, recipient_addressing
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import LookupStatus, message_id_for
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.rigs.servers.loopback import free_port
from digest_pipeline.rigs.servers.postmark_server import (
    TOKEN,
    PostmarkServer,
    error,
    hang_unaccepted,
)
from digest_pipeline.rigs.servers.provider_actions import (
    Action,
    malformed_success,
    status,
    store_then_drop,
    store_then_hang,
)
from digest_pipeline.services.deliver import deliver_due
from digest_pipeline.services.reconcile import reconcile_period
from digest_pipeline.settings import InvalidSetting, ProviderSettings, load_settings
from digest_pipeline.wiring import build_mailer
from digest_pipeline_tests.builders import email_of, key_of, make_deliverer, seed_period, state_of
from digest_pipeline_tests.conftest import T0, W42
from digest_pipeline_tests.fakes import FakeLedger, FixedClock
from digest_pipeline_tests.integration.provider_messages import DATE_HEADER, send
from digest_pipeline_tests.integration.provider_messages import message as provider_message

#: the client's timeouts: long enough for loopback, short enough that a hang costs little
TIMEOUT = 0.4
POLICY = DeliveryPolicy()

#: every message carries a `Date`, which the mailer must leave to Postmark
message = functools.partial(provider_message, extra=(DATE_HEADER,))


def settings_for(url: str, token: str, *, stream: str = "broadcast") -> ProviderSettings:
    return ProviderSettings(
        url=url,
        api_key=token,
        timeout_seconds=TIMEOUT,
        idempotency_window=timedelta(hours=24),
        message_stream=stream,
    )


@pytest.fixture
def server() -> Iterator[PostmarkServer]:
    with PostmarkServer(inactive=frozenset({email_of(9)})) as postmark:
        yield postmark


@pytest.fixture
def mailer(server: PostmarkServer) -> Iterator[PostmarkMailer]:
    with PostmarkMailer(settings_for(server.url, server.token)) as m:
        yield m


class TestFailureClasses:
    @pytest.mark.parametrize(
        ("action", "failure", "detail"),
        [
            # the token was refused: a credential refusal, whichever status carries code 10
            (error(401, 10), FailureClass.PERMANENT, "postmark:401:10"),
            (error(422, 10), FailureClass.PERMANENT, "postmark:422:10"),
            # the request or the recipient is wrong: retrying cannot help
            (error(422, 300), FailureClass.PERMANENT, "postmark:422:300"),
            (error(422, 406), FailureClass.PERMANENT, "postmark:422:406"),
            (error(422, 412), FailureClass.PERMANENT, "postmark:422:412"),
            # throttled: retried at Postmark's pace
            (error(429, 429), FailureClass.THROTTLED, "postmark:429:429"),
            # Postmark failed and took nothing: a resend is safe
            (error(500, 0), FailureClass.TRANSIENT, "postmark:500:0"),
            (status(503), FailureClass.TRANSIENT, "postmark:503:0"),
            # it stored the message and we never heard: may have been sent
            (store_then_hang(), FailureClass.UNKNOWN, "postmark:read_timeout"),
            (store_then_drop(), FailureClass.UNKNOWN, "postmark:remote_protocol_error"),
            (malformed_success(), FailureClass.UNKNOWN, "postmark:200:malformed"),
            # it never took it, but the client cannot know that: still unknown
            (hang_unaccepted(), FailureClass.UNKNOWN, "postmark:read_timeout"),
        ],
    )
    def test_postmark_answer_maps_to_failure_class(
        self,
        server: PostmarkServer,
        mailer: PostmarkMailer,
        action: Action,
        failure: FailureClass,
        detail: str,
    ) -> None:
        server.script(key_of(1), action)
        outcome = send(mailer, message())
        assert (outcome.accepted, outcome.failure_class, outcome.detail) == (False, failure, detail)

    def test_success_is_sent_with_postmarks_message_id(
        self, server: PostmarkServer, mailer: PostmarkMailer
    ) -> None:
        outcome = send(mailer, message())
        [accepted] = server.messages_for(key_of(1))
        assert outcome == SendOutcome.sent(accepted.message_id)

    def test_inactive_recipient_is_permanent_and_about_that_recipient(
        self, server: PostmarkServer, mailer: PostmarkMailer
    ) -> None:
        outcome = send(mailer, message(9))
        assert (outcome.failure_class, outcome.detail) == (
            FailureClass.PERMANENT,
            "postmark:422:406",
        )
        assert recipient_addressing(outcome)
        assert not credentials_refused(outcome)
        assert server.accepted == []

    @pytest.mark.parametrize(
        ("code", "account"),
        [
            (400, True),  # sender signature not found
            (401, True),  # sender signature not confirmed
            (405, True),  # not allowed to send: no credits left
            (412, True),  # account pending
            (413, True),  # account may not send
            (300, False),  # invalid email request: this message
            (406, False),  # inactive recipient: this customer
        ],
    )
    def test_the_senders_account_refusals_stop_the_run_and_fail_nobody(
        self, server: PostmarkServer, mailer: PostmarkMailer, code: int, account: bool
    ) -> None:
        server.script(key_of(1), error(422, code))
        outcome = send(mailer, message())
        assert outcome.failure_class is FailureClass.PERMANENT
        assert credentials_refused(outcome) is account
        # what the run records: retried once the account is fixed, or the customer's failure
        recorded = as_retryable(outcome).failure_class
        assert recorded is (FailureClass.TRANSIENT if account else FailureClass.PERMANENT)
        assert server.accepted == []

    def test_wrong_token_is_a_credential_refusal(self, server: PostmarkServer) -> None:
        with PostmarkMailer(settings_for(server.url, "pm-wrong-token-000")) as m:
            outcome = send(m, message())
        assert (outcome.failure_class, outcome.detail) == (
            FailureClass.PERMANENT,
            "postmark:401:10",
        )
        assert credentials_refused(outcome)
        assert server.accepted == []

    def test_throttle_honours_retry_after(
        self, server: PostmarkServer, mailer: PostmarkMailer
    ) -> None:
        server.script(key_of(1), Action("status", 429, "429", retry_after="30"))
        outcome = send(mailer, message())
        assert (outcome.failure_class, outcome.retry_after) == (
            FailureClass.THROTTLED,
            timedelta(seconds=30),
        )

    def test_closed_port_is_transient(self) -> None:
        with PostmarkMailer(settings_for(f"http://127.0.0.1:{free_port()}", "t")) as m:
            outcome = send(m, message())
        assert (outcome.failure_class, outcome.detail) == (
            FailureClass.TRANSIENT,
            "postmark:connect_error",
        )


class TestRequest:
    def test_request_follows_postmarks_send_api(
        self, server: PostmarkServer, mailer: PostmarkMailer
    ) -> None:
        send(mailer, message(7))
        [request] = server.received
        assert (request.method, request.path) == ("POST", "/email")
        assert request.headers["X-Postmark-Server-Token"] == server.token
        assert request.headers["Accept"] == "application/json"
        assert request.headers["Content-Type"] == "application/json"
        assert request.body == {
            "From": "digest@example.com",
            "To": email_of(7),
            "Subject": "Your weekly picks (2026-W42)",
            "TextBody": "Your picks",
            "HtmlBody": "<p>Your picks</p>",
            # no Date: Postmark stamps its own
            "Headers": [
                {"Name": "Message-ID", "Value": message_id_for(key_of(7))},
                {"Name": "X-Digest-Operation-Key", "Value": "digest:2026-W42:customer-0007"},
            ],
            "MessageStream": "broadcast",
            "Metadata": {"operation_key": "digest:2026-W42:customer-0007"},
            "TrackOpens": False,
            "TrackLinks": "None",
        }

    def test_every_send_carries_the_operation_key_in_metadata(
        self, server: PostmarkServer, mailer: PostmarkMailer
    ) -> None:
        server.script(key_of(2), error(500, 0))
        for n in (1, 2, 2, 3):
            send(mailer, message(n, html=None if n == 3 else "<p>x</p>"))
        sends = [r for r in server.received if r.method == "POST"]
        assert [r.body["Metadata"] for r in sends] == [
            {"operation_key": str(key_of(n))} for n in (1, 2, 2, 3)
        ]

    def test_a_key_longer_than_postmarks_metadata_limit_is_sent_and_found_by_its_digest(
        self, server: PostmarkServer, mailer: PostmarkMailer
    ) -> None:
        long_key = f"digest:2026-W42:{'c' * 100}"
        value = metadata_value(long_key)
        assert len(value) <= 80
        assert value == metadata_value(long_key)
        assert metadata_value(str(key_of(1))) == str(key_of(1))


class TestLookup:
    def test_found_and_not_found(self, server: PostmarkServer, mailer: PostmarkMailer) -> None:
        sent = send(mailer, message(1))
        found = mailer.lookup(str(key_of(1)))
        assert (found.status, found.provider_message_id) == (
            LookupStatus.FOUND,
            sent.provider_message_id,
        )
        assert mailer.lookup(str(key_of(2))).status is LookupStatus.NOT_FOUND
        search = server.received[-1]
        assert search.method == "GET"
        assert search.path.startswith("/messages/outbound?")

    def test_another_streams_message_is_not_found_in_this_stream(
        self, server: PostmarkServer
    ) -> None:
        with PostmarkMailer(settings_for(server.url, server.token, stream="outbound")) as m:
            send(m, message(1))
        with PostmarkMailer(settings_for(server.url, server.token)) as m:
            assert m.lookup(str(key_of(1))).status is LookupStatus.NOT_FOUND

    @pytest.mark.parametrize(
        "action", [error(500, 0), error(401, 10), hang_unaccepted()], ids=["500", "401", "hang"]
    )
    def test_a_failed_search_is_no_evidence(
        self, server: PostmarkServer, mailer: PostmarkMailer, action: Action
    ) -> None:
        server.script_search(action)
        assert mailer.lookup(str(key_of(1))).status is LookupStatus.UNSUPPORTED

    def test_capabilities_say_lookup_and_no_idempotency(self, mailer: PostmarkMailer) -> None:
        caps = mailer.capabilities
        assert (caps.idempotency_window, caps.can_lookup) == (None, True)


class TestReconciliation:
    def run(self, server: PostmarkServer, clock: FixedClock, action: Action) -> FakeLedger:
        """Three customers delivered; customer 1's answer never arrived."""
        ledger = FakeLedger()
        keys = seed_period(ledger, 3)
        server.script(keys[0], action)
        with PostmarkMailer(settings_for(server.url, server.token)) as mailer:
            deliverer = make_deliverer(ledger, mailer, clock, policy=POLICY)
            report = deliver_due(deliverer, batch_size=10, concurrency=3)
        assert report.outcomes == {"sent": 2, "unknown": 1}
        assert state_of(ledger, keys[0]) is DeliveryState.UNKNOWN
        return ledger

    def settle(self, server: PostmarkServer, ledger: FakeLedger, clock: FixedClock) -> str:
        with PostmarkMailer(settings_for(server.url, server.token)) as mailer:
            clock.advance(timedelta(minutes=5))
            report = reconcile_period(ledger, mailer, clock, POLICY, W42)
            deliver_due(
                make_deliverer(ledger, mailer, clock, policy=POLICY), batch_size=10, concurrency=1
            )
        [evidence] = report.evidence
        return evidence

    def test_accepted_before_the_timeout_is_settled_sent_without_a_second_send(
        self, server: PostmarkServer
    ) -> None:
        clock = FixedClock(T0)
        ledger = self.run(server, clock, store_then_hang())
        assert self.settle(server, ledger, clock) == "mailer_lookup_found"
        [accepted] = server.messages_for(key_of(1))
        item = ledger.get(key_of(1))
        assert item is not None
        assert (item.state, item.provider_message_id) == (
            DeliveryState.SENT,
            accepted.message_id,
        )
        assert [len(server.messages_for(key_of(n))) for n in (1, 2, 3)] == [1, 1, 1]
        assert all(r.passed for r in ledger.check_invariants(W42, clock.now()))

    def test_never_accepted_is_found_missing_and_sent_once_more(
        self, server: PostmarkServer
    ) -> None:
        clock = FixedClock(T0)
        ledger = self.run(server, clock, hang_unaccepted())
        assert server.messages_for(key_of(1)) == []
        assert self.settle(server, ledger, clock) == "mailer_lookup_not_found"
        assert state_of(ledger, key_of(1)) is DeliveryState.SENT
        assert [len(server.messages_for(key_of(n))) for n in (1, 2, 3)] == [1, 1, 1]
        assert all(r.passed for r in ledger.check_invariants(W42, clock.now()))

    def test_a_failed_search_leaves_the_item_unknown_and_sends_nothing(
        self, server: PostmarkServer
    ) -> None:
        clock = FixedClock(T0)
        ledger = self.run(server, clock, hang_unaccepted())
        server.script_search(error(503, 0))
        with PostmarkMailer(settings_for(server.url, server.token)) as mailer:
            report = reconcile_period(ledger, mailer, clock, POLICY, W42)
            deliver_due(
                make_deliverer(ledger, mailer, clock, policy=POLICY), batch_size=10, concurrency=1
            )
        assert report.still_unknown == 1
        assert state_of(ledger, key_of(1)) is DeliveryState.UNKNOWN
        assert server.messages_for(key_of(1)) == []

    def test_a_not_found_younger_than_the_search_lag_is_no_evidence(
        self, server: PostmarkServer
    ) -> None:
        # Postmark's search may not list a message it accepted moments ago: a "not found" about
        # a young attempt must not lead to a resend that could double it
        clock = FixedClock(T0)
        ledger = self.run(server, clock, hang_unaccepted())
        with PostmarkMailer(settings_for(server.url, server.token)) as mailer:
            clock.advance(LOOKUP_LAG - timedelta(seconds=1))
            report = reconcile_period(ledger, mailer, clock, POLICY, W42)
            deliver_due(
                make_deliverer(ledger, mailer, clock, policy=POLICY), batch_size=10, concurrency=1
            )
        assert report.still_unknown == 1
        assert state_of(ledger, key_of(1)) is DeliveryState.UNKNOWN
        assert server.messages_for(key_of(1)) == []


class TestSecrets:
    def test_token_and_address_never_reach_logs_or_details(
        self, server: PostmarkServer, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.DEBUG)
        server.script(key_of(2), error(500, 0))
        server.script(key_of(3), store_then_hang())
        server.script_search(error(500, 0))
        with PostmarkMailer(settings_for(server.url, server.token)) as m:
            outcomes = [send(m, message(n)) for n in (1, 2, 3)]
            m.lookup(str(key_of(3)))
            m.lookup(str(key_of(3)))
        with PostmarkMailer(settings_for(server.url, "pm-wrong-token-000")) as m:
            outcomes.append(send(m, message(4)))
        assert [o.label for o in outcomes] == ["sent", "transient", "unknown", "permanent"]
        assert {"digest_pipeline.adapters.postmark", "httpx"} <= {r.name for r in caplog.records}
        for text in [r.getMessage() for r in caplog.records] + [o.detail for o in outcomes]:
            assert server.token not in text
            assert "pm-wrong-token-000" not in text
            assert "@mailbox.example" not in text

    def test_identity_fingerprints_the_token_and_names_the_stream(
        self, server: PostmarkServer
    ) -> None:
        a = PostmarkMailer(settings_for(server.url, server.token))
        b = PostmarkMailer(settings_for(server.url, "pm-other-server-token"))
        c = PostmarkMailer(settings_for(server.url, server.token, stream="outbound"))
        assert a.identity.startswith("postmark:")
        assert server.token not in a.identity
        assert len({a.identity, b.identity, c.identity}) == 3
        assert server.token not in repr(settings_for(server.url, server.token))

    def test_construction_does_no_io(self) -> None:
        calls: list[httpx.Request] = []

        def record(request: httpx.Request) -> httpx.Response:
            calls.append(request)
            return httpx.Response(200, json={"ErrorCode": 0, "MessageID": "x"})

        settings = settings_for("http://unreachable.invalid:9", "t")
        mailer = PostmarkMailer(settings, transport=httpx.MockTransport(record))
        mailer.prepare()
        mailer.close()
        assert calls == []


class TestSettings:
    def test_postmark_needs_only_the_token_and_defaults_to_postmarks_api(self) -> None:
        env = {"DIGEST_MAILER": "postmark", "DIGEST_PROVIDER_API_KEY": TOKEN}
        settings = load_settings(env, Path("."))
        assert settings.provider is not None
        assert (settings.mailer, settings.provider.url, settings.provider.message_stream) == (
            "postmark",
            "https://api.postmarkapp.com",
            "broadcast",
        )
        assert isinstance(build_mailer(settings), PostmarkMailer)

    def test_resend_is_another_name_for_http(self) -> None:
        env = {
            "DIGEST_MAILER": "resend",
            "DIGEST_PROVIDER_URL": "https://api.resend.com",
            "DIGEST_PROVIDER_API_KEY": "re_key",
        }
        assert load_settings(env, Path(".")).mailer == "http"

    @pytest.mark.parametrize(
        ("env", "message"),
        [
            ({"DIGEST_MAILER": "postmark"}, "DIGEST_PROVIDER_API_KEY (the Postmark server token)"),
            (
                {
                    "DIGEST_MAILER": "postmark",
                    "DIGEST_PROVIDER_API_KEY": TOKEN,
                    "DIGEST_POSTMARK_MESSAGE_STREAM": "Digest Stream",
                },
                "DIGEST_POSTMARK_MESSAGE_STREAM='Digest Stream': must be a message stream ID",
            ),
        ],
    )
    def test_refusals_are_one_line_and_keep_the_token_out(
        self, env: dict[str, str], message: str
    ) -> None:
        with pytest.raises(InvalidSetting) as refused:
            load_settings(env, Path("."))
        assert str(refused.value).startswith(message)
        assert "\n" not in str(refused.value)
        assert TOKEN not in str(refused.value)
