"""The SES mailer's rig: moto's SES v2 server behind the fault proxy, settled by an SNS event.

SES takes no idempotency key and offers no lookup, so its `unknown` sends are settled by the
`Delivery` event SES publishes through SNS: signed here as SNS signs, with the certificate served
over TLS on loopback, and posted to `digest serve`'s application at `/events/ses`.
"""

import json
import re
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from typing import ClassVar

import httpx

from digest_pipeline.adapters.mail.ses import SesMailer
from digest_pipeline.adapters.sql.feedback import SqlFeedbackStore, concurrent_callers
from digest_pipeline.adapters.webhooks.sns import HttpsFetcher
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.domain.ses_tags import tag_value
from digest_pipeline.ports import Mailer
from digest_pipeline.rigs.servers.loopback import free_port
from digest_pipeline.rigs.servers.provider_actions import (
    Action,
    status,
    store_then_drop,
    store_then_hang,
)
from digest_pipeline.rigs.servers.ses_server import REGION, SesServer
from digest_pipeline.serve.app import ServeConfig, build_app
from digest_pipeline.serve.server import BackgroundServer
from digest_pipeline.ses_settings import SesSettings
from digest_pipeline.sns_settings import SnsSettings
from digest_pipeline_tests.contract.mailer_rigs import (
    HANG,
    TIMEOUT,
    Fault,
    MailerRig,
    Setup,
    World,
)
from digest_pipeline_tests.sns_signing import (
    CERT_PATH,
    TOPIC,
    LoopbackHttps,
    loopback_https,
    sign,
    signing_identity,
    sns_timestamp,
)

#: one key pair for every SES rig of the process: RSA key generation is the slow part
SNS = signing_identity()


class SesRig(MailerRig):
    """Amazon SES v2 `SendEmail`: no key, no lookup, settled by its events through SNS."""

    name = "ses"
    answers: ClassVar[Mapping[Fault, object]] = {
        Fault.RATE_LIMITED: status(429, "TooManyRequestsException", retry_after=30),
        Fault.SERVER_ERROR: status(500, "InternalFailure"),
        # in the sandbox SES refuses an unverified recipient, and any account a message it will
        # not send, with the same code: a refusal of this message, never of the account
        Fault.RECIPIENT_REFUSED: status(400, "MessageRejected"),
        Fault.CONTENT_REFUSED: status(400, "MessageRejected"),
        # moto checks no signature, so the refusal of a revoked key is SES's answer to one
        Fault.CREDENTIAL_REFUSED: status(403, "UnrecognizedClientException"),
        Fault.NEVER_CONNECTED: Setup.CLOSED_PORT,
        Fault.TIMEOUT_BEFORE_ANSWER: store_then_hang(HANG),
        Fault.ANSWER_LOST: store_then_drop(),
    }
    stated_wait = timedelta(seconds=30)
    proves_send, evidence = False, "provider_event"

    def _start(self) -> None:
        self._stack = ExitStack()
        self.server = self._stack.enter_context(SesServer())
        self.https: LoopbackHttps = self._stack.enter_context(_certificate_server())

    def _stop(self) -> None:
        self._stack.close()

    def _new_mailer(self, reachable: bool) -> Mailer:
        url = self.server.url if reachable else f"http://127.0.0.1:{free_port()}"
        settings = SesSettings(
            region=REGION,
            endpoint_url=url,
            configuration_set=None,
            timeout_seconds=TIMEOUT,
            access_key_id=self.server.access_key_id,
            secret_access_key=self.server.secret_access_key,
        )
        return SesMailer(settings)

    def _script(self, key: OperationKey, answer: object) -> None:
        assert isinstance(answer, Action)
        self.server.script(key, answer)

    def held(self, key: OperationKey) -> int:
        return self.server.delivered_count(key)

    def message_id(self, key: OperationKey) -> str | None:
        return self.server.message_id(key)

    def settle(self, world: World, key: OperationKey) -> str:
        """SES publishes the message's `Delivery` event; SNS posts it to `digest serve`."""
        record = {
            "eventType": "Delivery",
            "mail": {
                "timestamp": sns_timestamp(world.clock.now()),
                "messageId": self.server.message_id(key),
                "tags": {"operation_key": [tag_value(key)]},
            },
            "delivery": {"smtpResponse": "250 2.0.0 OK"},
        }
        message = sign(
            {
                "Type": "Notification",
                "MessageId": f"sns-delivery-{key.customer_id}",
                "TopicArn": TOPIC,
                "Message": json.dumps(record),
                "Timestamp": sns_timestamp(world.clock.now()),
                "SigningCertURL": self.https.url(CERT_PATH),
                "UnsubscribeURL": self.https.url("/?Action=Unsubscribe"),
            },
            SNS.key,
        )
        config = ServeConfig(
            unsubscribe_secret="a-private-secret-for-contract-tests",
            ledger_threads=concurrent_callers(world.engine),
            sns=SnsSettings(
                frozenset({TOPIC}), re.compile(re.escape(f"127.0.0.1:{self.https.port}"))
            ),
            sns_fetcher=HttpsFetcher(verify=self.https.client_context),
        )
        store, ledger = SqlFeedbackStore(world.engine), world.ledger
        app = build_app(config=config, store=store, ledger=ledger, queue=ledger, clock=world.clock)
        headers = {
            "content-type": "text/plain; charset=UTF-8",
            "x-amz-sns-message-type": "Notification",
        }
        with BackgroundServer(app) as site:
            answer = httpx.post(
                f"{site.url}/events/ses", content=json.dumps(message), headers=headers, timeout=30
            )
        if answer.status_code != 200:
            raise AssertionError(f"/events/ses answered {answer.status_code} {answer.text}")
        return self.evidence


@contextmanager
def _certificate_server() -> Iterator[LoopbackHttps]:
    """A loopback HTTPS server publishing the signing certificate, as SNS publishes its own."""
    with loopback_https() as https:
        https.serve(CERT_PATH, SNS.cert_pem)
        yield https
