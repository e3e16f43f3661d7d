"""The SES mailer against SES v2 over HTTP on loopback: moto's server behind a fault proxy.

Moto runs in this process (no service to start: default suite). Every row of the mailer's fault
table maps to its failure class with one HTTP request per send (boto3's retries are off); a send
whose answer is lost is `unknown` and reconciliation never sends it again (SES has no idempotency
key): moto holds exactly one message for the key. Assertions are about what moto holds and what
the proxy received.
"""

import base64
import email
import functools
import logging
import pickle
from collections.abc import Iterator
from datetime import timedelta

import pytest

from digest_pipeline.adapters.mail.mime import to_bytes
from digest_pipeline.adapters.mail.ses import CREDENTIAL_REFUSALS, SesMailer
from digest_pipeline.domain.breaker import credentials_refused
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import message_id_for
from digest_pipeline.domain.pacing import QUOTA_PAUSE, Pause, pause_after
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.domain.ses_tags import key_of_tag
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.rigs.servers.loopback import free_port
from digest_pipeline.rigs.servers.provider_actions import (
    Action,
    malformed_success,
    quota,
    status,
    store_then_drop,
    store_then_hang,
)
from digest_pipeline.rigs.servers.ses_server import MotoSes, SesServer
from digest_pipeline.services.deliver import deliver_due
from digest_pipeline.services.reconcile import reconcile_period
from digest_pipeline.ses_settings import SesSettings
from digest_pipeline_tests.aws_env import isolate_aws
from digest_pipeline_tests.builders import email_of, key_of, make_deliverer, seed_period, state_of
from digest_pipeline_tests.conftest import T0, W42
from digest_pipeline_tests.fakes import FakeLedger, FixedClock
from digest_pipeline_tests.integration.provider_messages import message as provider_message
from digest_pipeline_tests.integration.provider_messages import send

TIMEOUT = 0.4
POLICY = DeliveryPolicy()
UNSUBSCRIBE = (
    ("List-Unsubscribe", "<https://shop.example/unsubscribe/customer-0001?token=t>"),
    ("List-Unsubscribe-Post", "List-Unsubscribe=One-Click"),
)
#: a named sender; SES checks the bare address, the From header keeps the name
message = functools.partial(
    provider_message, sender="Linden Home <digest@example.com>", extra=UNSUBSCRIBE
)


@pytest.fixture(autouse=True)
def aws_isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    """No developer's AWS files, variables or instance metadata reach boto3 here."""
    isolate_aws(monkeypatch)


def settings_for(
    url: str | None,
    server: SesServer | None = None,
    *,
    secret: str | None = None,
    configuration_set: str | None = None,
) -> SesSettings:
    return SesSettings(
        region="eu-west-1",
        endpoint_url=url,
        configuration_set=configuration_set,
        timeout_seconds=TIMEOUT,
        access_key_id=server.access_key_id if server else "AKIAOTHERACCOUNT0001",
        secret_access_key=secret or (server.secret_access_key if server else "other-secret"),
    )


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoSes]:
    with MotoSes() as server:
        yield server


@pytest.fixture
def server(moto: MotoSes) -> Iterator[SesServer]:
    with SesServer(moto) as ses:
        yield ses
        assert ses.handler_errors == 0


@pytest.fixture
def mailer(server: SesServer) -> Iterator[SesMailer]:
    with SesMailer(settings_for(server.url, server)) as m:
        yield m


class TestAccepted:
    def test_accepted_is_sent_with_the_message_id_moto_gave(
        self, server: SesServer, mailer: SesMailer
    ) -> None:
        outcome = send(mailer, message())
        [held] = server.messages()
        assert outcome == SendOutcome.sent(held.message_id)
        assert server.delivered_count(key_of(1)) == 1

    def test_moto_holds_the_raw_message_with_our_headers_byte_for_byte(
        self, server: SesServer, mailer: SesMailer
    ) -> None:
        msg = message()
        send(mailer, msg)
        [held] = server.messages()
        assert held.raw == to_bytes(msg, seven_bit=True)
        headers = email.message_from_bytes(held.raw)
        assert headers["X-Digest-Operation-Key"] == str(key_of(1))
        assert headers["Message-ID"] == message_id_for(key_of(1))
        assert headers["List-Unsubscribe"] == UNSUBSCRIBE[0][1]
        assert headers["From"] == "Linden Home <digest@example.com>"
        assert (held.source, email_of(1) in held.destinations) == ("digest@example.com", True)

    def test_the_request_carries_the_key_as_a_tag_and_the_configuration_set(
        self, server: SesServer
    ) -> None:
        settings = settings_for(server.url, server, configuration_set="digest-events")
        with SesMailer(settings) as m:
            assert send(m, message(7)).accepted
        [request] = server.received
        assert request.path == "/v2/email/outbound-emails"
        body = request.body
        [tag] = body["EmailTags"]
        assert (tag["Name"], key_of_tag(tag["Value"])) == ("operation_key", key_of(7))
        assert body["ConfigurationSetName"] == "digest-events"
        assert body["FromEmailAddress"] == "digest@example.com"
        assert body["Destination"] == {"ToAddresses": [email_of(7)]}
        assert base64.b64decode(body["Content"]["Raw"]["Data"]) == server.messages()[0].raw

    def test_no_configuration_set_is_named_unless_one_is_set(
        self, server: SesServer, mailer: SesMailer
    ) -> None:
        send(mailer, message())
        assert "ConfigurationSetName" not in server.received[0].body

    def test_an_answer_without_a_message_id_is_still_sent(
        self, server: SesServer, mailer: SesMailer
    ) -> None:
        server.script(key_of(1), malformed_success())
        assert send(mailer, message()) == SendOutcome.sent(None)
        assert server.delivered_count(key_of(1)) == 1


#: (what the proxy answers, class, detail); `ses:<Code>` or, without a code, `ses:<status>`
FAULTS = [
    (
        status(429, "TooManyRequestsException"),
        FailureClass.THROTTLED,
        "ses:TooManyRequestsException",
    ),
    (status(400, "Throttling"), FailureClass.THROTTLED, "ses:Throttling"),
    (status(400, "ThrottlingException"), FailureClass.THROTTLED, "ses:ThrottlingException"),
    (status(429), FailureClass.THROTTLED, "ses:429"),
    (status(400, "LimitExceededException"), FailureClass.THROTTLED, "ses:LimitExceededException"),
    (quota(), FailureClass.THROTTLED, "ses:TooManyRequestsException:daily_quota"),
    (status(400, "SendingPausedException"), FailureClass.PERMANENT, "ses:SendingPausedException"),
    (
        status(400, "AccountSuspendedException"),
        FailureClass.PERMANENT,
        "ses:AccountSuspendedException",
    ),
    (
        status(400, "MailFromDomainNotVerifiedException"),
        FailureClass.PERMANENT,
        "ses:MailFromDomainNotVerifiedException",
    ),
    (status(404, "NotFoundException"), FailureClass.PERMANENT, "ses:NotFoundException"),
    (
        status(403, "UnrecognizedClientException"),
        FailureClass.PERMANENT,
        "ses:UnrecognizedClientException",
    ),
    (
        status(403, "InvalidSignatureException"),
        FailureClass.PERMANENT,
        "ses:InvalidSignatureException",
    ),
    (status(403, "SignatureDoesNotMatch"), FailureClass.PERMANENT, "ses:SignatureDoesNotMatch"),
    (status(403, "AccessDeniedException"), FailureClass.PERMANENT, "ses:AccessDeniedException"),
    (status(403, "ExpiredTokenException"), FailureClass.PERMANENT, "ses:ExpiredTokenException"),
    (status(400, "MessageRejected"), FailureClass.PERMANENT, "ses:MessageRejected"),
    (status(400, "BadRequestException"), FailureClass.PERMANENT, "ses:BadRequestException"),
    (status(418), FailureClass.PERMANENT, "ses:418"),
    (status(408, "RequestTimeout"), FailureClass.TRANSIENT, "ses:RequestTimeout"),
    (status(500, "InternalFailure"), FailureClass.TRANSIENT, "ses:InternalFailure"),
    (status(503, "ServiceUnavailable"), FailureClass.TRANSIENT, "ses:ServiceUnavailable"),
    (status(502), FailureClass.TRANSIENT, "ses:502"),
    # accepted, then the answer was lost: it may go out; never resent blindly
    (store_then_hang(), FailureClass.UNKNOWN, "ses:read_timeout_error"),
    (store_then_drop(), FailureClass.UNKNOWN, "ses:connection_closed_error"),
]


class TestFaultTable:
    @pytest.mark.parametrize(("action", "failure", "detail"), FAULTS, ids=[d for _, _, d in FAULTS])
    def test_answer_maps_to_failure_class_in_one_request(
        self,
        server: SesServer,
        mailer: SesMailer,
        action: Action,
        failure: FailureClass,
        detail: str,
    ) -> None:
        server.script(key_of(1), action)
        outcome = send(mailer, message())
        assert (outcome.accepted, outcome.failure_class, outcome.detail) == (False, failure, detail)
        # boto3's retries are off: the ledger decides what happens next, not the SDK
        assert server.requests == 1
        stored = 1 if failure is FailureClass.UNKNOWN else 0
        assert server.delivered_count(key_of(1)) == stored

    @pytest.mark.parametrize(
        ("action", "detail"),
        [
            (quota(), "ses:TooManyRequestsException:daily_quota"),
            (status(400, "LimitExceededException"), "ses:LimitExceededException"),
        ],
    )
    def test_a_spent_quota_pauses_every_sender(
        self, server: SesServer, mailer: SesMailer, action: Action, detail: str
    ) -> None:
        server.script(key_of(1), action)
        outcome = send(mailer, message())
        assert (outcome.failure_class, outcome.detail, outcome.quota) == (
            FailureClass.THROTTLED,
            detail,
            True,
        )
        assert pause_after(outcome, T0) == Pause(T0 + QUOTA_PAUSE, detail)

    def test_the_per_second_rate_pauses_nobody_without_a_wait(
        self, server: SesServer, mailer: SesMailer
    ) -> None:
        server.script(key_of(1), status(429, "TooManyRequestsException"))
        outcome = send(mailer, message())
        assert (outcome.quota, pause_after(outcome, T0)) == (False, None)

    def test_throttling_honours_retry_after(self, server: SesServer, mailer: SesMailer) -> None:
        server.script(key_of(1), status(429, "TooManyRequestsException", retry_after=30))
        outcome = send(mailer, message())
        assert (outcome.failure_class, outcome.retry_after) == (
            FailureClass.THROTTLED,
            timedelta(seconds=30),
        )

    def test_a_refusal_never_echoes_ses_free_text(
        self, server: SesServer, mailer: SesMailer
    ) -> None:
        server.script(key_of(1), status(400, "MessageRejected"))
        outcome = send(mailer, message())
        assert outcome.detail == "ses:MessageRejected"
        assert "mailbox.example" not in repr(outcome)

    @pytest.mark.parametrize("code", sorted(CREDENTIAL_REFUSALS))
    def test_the_breaker_reads_credential_and_account_refusals(
        self, server: SesServer, mailer: SesMailer, code: str
    ) -> None:
        server.script(key_of(1), status(403, code))
        outcome = send(mailer, message())
        assert outcome.failure_class is FailureClass.PERMANENT
        assert credentials_refused(outcome)

    @pytest.mark.parametrize("code", ["MessageRejected", "BadRequestException", "Throttling"])
    def test_the_breaker_does_not_read_other_refusals_as_credentials(
        self, server: SesServer, mailer: SesMailer, code: str
    ) -> None:
        server.script(key_of(1), status(400, code))
        assert not credentials_refused(send(mailer, message()))

    def test_an_unverified_sender_is_refused_by_moto_itself(
        self, server: SesServer, mailer: SesMailer
    ) -> None:
        outcome = send(mailer, provider_message(sender="Other <news@unverified.example>"))
        assert (outcome.failure_class, outcome.detail) == (
            FailureClass.PERMANENT,
            "ses:MessageRejected:sender_refused",
        )
        # the sender's configuration, not the customer's: the breaker stops the run
        assert credentials_refused(outcome)
        assert (server.messages(), server.requests) == ([], 1)

    def test_closed_port_is_transient(self, server: SesServer) -> None:
        with SesMailer(settings_for(f"http://127.0.0.1:{free_port()}", server)) as m:
            outcome = send(m, message())
        assert (outcome.failure_class, outcome.detail) == (
            FailureClass.TRANSIENT,
            "ses:endpoint_connection_error",
        )

    def test_no_credentials_anywhere_is_a_credential_refusal_before_anything_left(
        self, server: SesServer
    ) -> None:
        # boto3's default chain, with no variable, file or instance role to find
        settings = SesSettings("eu-west-1", server.url, None, TIMEOUT)
        with SesMailer(settings) as m:
            outcome = send(m, message())
        assert (outcome.failure_class, outcome.detail) == (
            FailureClass.PERMANENT,
            "ses:no_credentials",
        )
        assert credentials_refused(outcome)
        assert server.requests == 0

    def test_mismatched_key_is_refused_before_any_request(
        self, server: SesServer, mailer: SesMailer
    ) -> None:
        outcome = mailer.send(message(1), idempotency_key=str(key_of(2)))
        assert (outcome.failure_class, server.requests) == (FailureClass.PERMANENT, 0)

    def test_an_unsendable_message_is_refused_before_any_request(
        self, server: SesServer, mailer: SesMailer
    ) -> None:
        bad = provider_message(extra=(("X-Note", "line\r\nBcc: someone@mailbox.example"),))
        outcome = send(mailer, bad)
        assert (outcome.failure_class, outcome.detail) == (FailureClass.PERMANENT, "render_error")
        assert server.requests == 0


class TestMailer:
    def test_capabilities_promise_no_idempotency_and_no_lookup(self) -> None:
        capabilities = SesMailer(settings_for(None)).capabilities
        assert (capabilities.idempotency_window, capabilities.can_lookup) == (None, False)

    def test_identity_tells_accounts_regions_and_endpoints_apart(self) -> None:
        base = settings_for(None)
        others = [
            SesSettings("eu-west-1", None, None, TIMEOUT, "AKIASECONDACCOUNT001", "s"),
            SesSettings("us-east-1", None, None, TIMEOUT, base.access_key_id, "s"),
            SesSettings(
                "eu-west-1", "https://vpce.example", None, TIMEOUT, base.access_key_id, "s"
            ),
        ]
        identity = SesMailer(base).identity
        assert identity.startswith("ses:")
        assert all(SesMailer(o).identity != identity for o in others)
        # a new secret for the same key id is the same account, and so the same mailer
        same = SesSettings("eu-west-1", None, None, TIMEOUT, base.access_key_id, "rotated")
        assert SesMailer(same).identity == identity
        assert str(base.access_key_id) not in identity

    def test_rotating_credentials_keep_one_identity(self) -> None:
        # a role's temporary key id changes with every rotation; the account does not
        first = SesSettings("eu-west-1", None, None, TIMEOUT, "ASIAFIRST", "s", "token-1")
        second = SesSettings("eu-west-1", None, None, TIMEOUT, "ASIASECOND", "s", "token-2")
        chain = SesSettings("eu-west-1", None, None, TIMEOUT)
        assert SesMailer(first).identity == SesMailer(second).identity == SesMailer(chain).identity

    def test_the_recipe_pickles_and_builds_the_same_mailer(self, server: SesServer) -> None:
        mailer = SesMailer(settings_for(server.url, server), max_connections=4)
        recipe = mailer.recipe()
        assert recipe is not None
        rebuilt = pickle.loads(pickle.dumps(recipe))()
        assert rebuilt.identity == mailer.identity
        assert send(rebuilt, message()).accepted
        rebuilt.close()

    @pytest.mark.parametrize("with_keys", [True, False])
    def test_construction_identity_and_prepare_do_no_io(
        self, server: SesServer, with_keys: bool
    ) -> None:
        settings = settings_for(server.url, server)
        if not with_keys:
            settings = SesSettings("eu-west-1", server.url, None, TIMEOUT)
        mailer = SesMailer(settings)
        _ = (mailer.identity, mailer.capabilities)
        mailer.prepare()
        mailer.close()
        assert (server.requests, server.messages()) == (0, [])

    def test_a_closed_mailer_sends_again(self, server: SesServer, mailer: SesMailer) -> None:
        assert send(mailer, message(1)).accepted
        mailer.close()
        assert send(mailer, message(2)).accepted
        assert [server.delivered_count(key_of(n)) for n in (1, 2)] == [1, 1]


class TestReconciliation:
    def test_a_lost_answer_stays_unknown_and_is_never_resent(self, server: SesServer) -> None:
        ledger = FakeLedger()
        clock = FixedClock(T0)
        keys = seed_period(ledger, 3)
        server.script(keys[0], store_then_hang(seconds=2 * TIMEOUT + 1))
        server.script(keys[1], status(500, "InternalFailure"))
        with SesMailer(settings_for(server.url, server)) as mailer:
            deliverer = make_deliverer(ledger, mailer, clock, policy=POLICY)
            report = deliver_due(deliverer, batch_size=10, concurrency=3)
            assert report.outcomes == {"sent": 1, "unknown": 1, "retry_scheduled": 1}
            for later in (timedelta(minutes=5), timedelta(hours=30)):
                clock.advance(later)
                reconciled = reconcile_period(ledger, mailer, clock, POLICY, W42)
                assert reconciled.still_unknown == 1
                deliver_due(deliverer, batch_size=10, concurrency=1)
        assert state_of(ledger, keys[0]) is DeliveryState.UNKNOWN
        assert [state_of(ledger, k) for k in keys[1:]] == [DeliveryState.SENT] * 2
        assert [server.delivered_count(k) for k in keys] == [1, 1, 1]
        # the 500 cost one request, and its retry one more: nothing else was sent for it
        assert (
            sum(
                1 for r in server.received if key_of_tag(r.body["EmailTags"][0]["Value"]) == keys[1]
            )
            == 2
        )
        assert all(r.passed for r in ledger.check_invariants(W42, clock.now()))


class TestSecrets:
    def test_secret_and_address_never_reach_logs_or_details(
        self, server: SesServer, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.DEBUG)
        server.script(key_of(2), status(500, "InternalFailure"))
        server.script(key_of(3), store_then_drop())
        server.script(key_of(4), status(403, "UnrecognizedClientException"))
        with SesMailer(settings_for(server.url, server)) as m:
            outcomes = [send(m, message(n)) for n in (1, 2, 3, 4)]
        with SesMailer(settings_for(f"http://127.0.0.1:{free_port()}", server)) as m:
            outcomes.append(send(m, message(5)))
        assert [o.label for o in outcomes] == [
            "sent",
            "transient",
            "unknown",
            "permanent",
            "transient",
        ]
        assert {"digest_pipeline.adapters.ses", "botocore.endpoint"} <= {
            r.name for r in caplog.records
        }
        for record in caplog.records:
            text = record.getMessage()
            # botocore's own DEBUG lines dump the request body (the address): only the secret
            # is kept out of every level
            assert server.secret_access_key not in text
            if record.name.startswith("digest_pipeline") or record.levelno >= logging.INFO:
                assert "@mailbox.example" not in text
        for outcome in outcomes:
            assert server.secret_access_key not in repr(outcome)
            assert "@mailbox.example" not in repr(outcome)

    def test_settings_and_mailer_reprs_hide_the_secret(self, server: SesServer) -> None:
        settings = settings_for(server.url, server)
        mailer = SesMailer(settings)
        mailer.prepare()
        assert server.secret_access_key not in repr(settings)
        assert server.secret_access_key not in repr(mailer.__dict__)
        mailer.close()


def test_hang_is_past_the_clients_timeout(server: SesServer, mailer: SesMailer) -> None:
    """The rig's own promise: a hang outlasts the client, so the timeout is what ends it."""
    server.script(key_of(1), store_then_hang(seconds=5))
    assert send(mailer, message()).detail == "ses:read_timeout_error"
    assert server.delivered_count(key_of(1)) == 1
