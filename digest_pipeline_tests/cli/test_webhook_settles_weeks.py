"""A week whose answers were all lost, settled by the provider's own webhook through `digest serve`.

For each provider without an idempotency key, `digest run` sends a small demo week through the
real mailer to the provider's loopback server, which accepts and stores every message and then
drops the connection before answering: every item is `unknown`. The real `digest serve` process
then takes the provider's `delivered` events, authenticated the provider's way (SendGrid's ECDSA
signature, Postmark's basic auth; Amazon SES's through SNS, signed as SNS signs and checked
against a certificate fetched over TLS; Postmark's message search is down, so its lookup finds
nothing), and `digest sweep` cleans up. SES itself is moto's server behind a fault proxy. The provider's store, not the
ledger, says that every customer got exactly one message, and the ledger's invariants hold.
"""

import base64
import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from digest_pipeline.adapters.clock import SystemClock
from digest_pipeline.adapters.webhooks.sendgrid import SIGNATURE_HEADER, TIMESTAMP_HEADER
from digest_pipeline.domain.ses_tags import tag_value
from digest_pipeline.rigs.servers.postmark_server import PostmarkServer, error
from digest_pipeline.rigs.servers.provider_actions import store_then_drop
from digest_pipeline.rigs.servers.sendgrid_server import SendGridServer
from digest_pipeline.rigs.servers.serve_process import ServeProcess
from digest_pipeline.rigs.servers.ses_server import HERMETIC_AWS, REGION, SesServer
from digest_pipeline_tests.cli.conftest import Cli
from digest_pipeline_tests.sns_signing import (
    CERT_PATH,
    TOPIC,
    loopback_ca_pem,
    loopback_https,
    signing_identity,
    sns_timestamp,
)
from digest_pipeline_tests.sns_signing import sign as sns_sign
from digest_pipeline_tests.unit.sendgrid_signing import PRIVATE, PUBLIC_TEXT, sign

CUSTOMERS = 6
POSTMARK_HOOK = "postmark-hooks:a-long-webhook-password"


@dataclass
class Provider:
    """One provider's loopback server, the settings that point the mailer at it, and its hooks."""

    env: dict[str, str]
    #: the keys the provider stored a message for, with how many messages each
    held: Callable[[], dict[str, int]]
    #: arranges that every send of these keys is stored and its answer lost, and that the
    #: provider's webhook is the only evidence of the send
    lose_answers: Callable[[list[str]], None]
    #: posts the provider's `delivered` event for every stored message to `digest serve`
    deliver_events: Callable[[str], list[httpx.Response]]
    #: what `digest serve` alone needs besides `env` (the trust of a test CA)
    serve_env: dict[str, str] = field(default_factory=dict)


@contextmanager
def sendgrid() -> Iterator[Provider]:
    with SendGridServer(fallback=store_then_drop()) as server:

        def events(serve_url: str) -> list[httpx.Response]:
            batch = [
                {
                    "event": "delivered",
                    "sg_event_id": f"delivered-{n}",
                    "sg_message_id": f"{server.message_id(key)}.filter0001.1-2",
                    "timestamp": int(time.time()),
                    "operation_key": key,
                }
                for n, key in enumerate(sorted(server.stored))
            ]
            body = json.dumps(batch).encode()
            stamp = str(int(time.time()))
            headers = {
                "content-type": "application/json",
                TIMESTAMP_HEADER: stamp,
                SIGNATURE_HEADER: sign(PRIVATE, stamp, body),
            }
            return [httpx.post(f"{serve_url}/events/sendgrid", content=body, headers=headers)]

        yield Provider(
            env={
                "DIGEST_MAILER": "sendgrid",
                "DIGEST_PROVIDER_URL": server.url,
                "DIGEST_PROVIDER_API_KEY": server.api_key,
                "DIGEST_WEBHOOK_SECRETS": f"sendgrid={PUBLIC_TEXT}",
            },
            held=lambda: {k: len(v) for k, v in server.stored.items()},
            lose_answers=lambda keys: None,  # the server's fallback already loses every answer
            deliver_events=events,
        )


@contextmanager
def postmark() -> Iterator[Provider]:
    with PostmarkServer() as server:

        def held() -> dict[str, int]:
            return Counter(str(a.metadata["operation_key"]) for a in server.accepted)

        def lose(keys: list[str]) -> None:
            for key in keys:
                server.script(key, store_then_drop())
            # Postmark's message search is down, so the run's reconciliation finds nothing
            server.script_search(*[error(503, 0)] * 100)

        def events(serve_url: str) -> list[httpx.Response]:
            token = base64.b64encode(POSTMARK_HOOK.encode()).decode()
            return [
                httpx.post(
                    f"{serve_url}/events/postmark",
                    json={
                        "RecordType": "Delivery",
                        "MessageID": accepted.message_id,
                        "Metadata": accepted.metadata,
                        "DeliveredAt": "2026-12-07T06:00:00Z",
                    },
                    headers={"Authorization": f"Basic {token}"},
                )
                for accepted in server.accepted
            ]

        yield Provider(
            env={
                "DIGEST_MAILER": "postmark",
                "DIGEST_PROVIDER_URL": server.url,
                "DIGEST_PROVIDER_API_KEY": server.token,
                "DIGEST_WEBHOOK_SECRETS": f"postmark={POSTMARK_HOOK}",
            },
            held=held,
            lose_answers=lose,
            deliver_events=events,
        )


@contextmanager
def ses(folder: Path) -> Iterator[Provider]:
    sns = signing_identity()
    with SesServer() as server, loopback_https() as https:
        cert_url = https.serve(CERT_PATH, sns.cert_pem)
        trusted = folder / "test-ca.pem"
        trusted.write_bytes(loopback_ca_pem())

        def held() -> dict[str, int]:
            return Counter(m.operation_key for m in server.messages() if m.operation_key)

        def lose(keys: list[str]) -> None:
            for key in keys:
                server.script(key, store_then_drop())

        def events(serve_url: str) -> list[httpx.Response]:
            answers = []
            for n, key in enumerate(sorted(held())):
                record = {
                    "eventType": "Delivery",
                    "mail": {
                        "timestamp": sns_timestamp(datetime.now(UTC)),
                        "messageId": server.message_id(key),
                        "tags": {"operation_key": [tag_value(key)]},
                    },
                    "delivery": {"processingTimeMillis": 512, "smtpResponse": "250 2.0.0 OK"},
                }
                message = sns_sign(
                    {
                        "Type": "Notification",
                        "MessageId": f"sns-delivery-{n}",
                        "TopicArn": TOPIC,
                        "Message": json.dumps(record),
                        "Timestamp": sns_timestamp(datetime.now(UTC)),
                        "SigningCertURL": cert_url,
                        "UnsubscribeURL": https.url("/?Action=Unsubscribe"),
                    },
                    sns.key,
                )
                headers = {
                    "content-type": "text/plain; charset=UTF-8",
                    "x-amz-sns-message-type": "Notification",
                    "x-amz-sns-message-id": message["MessageId"],
                    "x-amz-sns-topic-arn": TOPIC,
                }
                body = json.dumps(message).encode()
                answers.append(httpx.post(f"{serve_url}/events/ses", content=body, headers=headers))
            return answers

        yield Provider(
            env={
                "DIGEST_MAILER": "ses",
                "DIGEST_SES_REGION": REGION,
                "DIGEST_SES_ENDPOINT_URL": server.url,
                "AWS_ACCESS_KEY_ID": server.access_key_id,
                "AWS_SECRET_ACCESS_KEY": server.secret_access_key,
                # nothing of the developer's own AWS set-up takes part
                **HERMETIC_AWS,
                "DIGEST_SES_TOPIC_ARNS": TOPIC,
                "DIGEST_SNS_CERT_HOST_PATTERN": https.host_pattern,
            },
            held=held,
            lose_answers=lose,
            deliver_events=events,
            # the certificate is fetched over TLS from a server whose CA only this test trusts
            serve_env={"SSL_CERT_FILE": str(trusted)},
        )


PROVIDERS: dict[str, Callable[[Path], Any]] = {
    "sendgrid": lambda _: sendgrid(),
    "postmark": lambda _: postmark(),
    "ses": ses,
}


def by_state(digest: Cli) -> dict[str, int]:
    status = digest("status", "--period", "latest", "--json").json()
    assert all(check["passed"] for check in status["invariants"].values()), status["invariants"]
    return dict(status["by_state"])


@pytest.mark.parametrize("name", sorted(PROVIDERS))
def test_a_week_of_lost_answers_is_settled_by_webhooks_and_sent_once(
    name, env, monkeypatch, tmp_path
):
    with PROVIDERS[name](tmp_path) as provider:
        run_env = {**env, **provider.env, "DIGEST_UNSUBSCRIBE_SECRET": "a-private-e2e-secret"}
        for variable, value in run_env.items():  # the Dagster job's resources read os.environ
            monkeypatch.setenv(variable, value)
        digest = Cli(run_env, SystemClock())
        assert digest("seed", "--customers", str(CUSTOMERS), "--seed", "5").code == 0
        period = digest("status", "--period", "latest", "--json").json()["period"]
        keys = [f"digest:{period}:customer-{n:04d}" for n in range(1, CUSTOMERS + 1)]
        provider.lose_answers(keys)

        run = digest("run", "--period", "latest")
        assert run.code in (0, 1), run.err
        sent_once = provider.held()
        assert sent_once, "the provider stored nothing"
        assert set(sent_once.values()) == {1}
        # every answer was lost after the provider stored the message: nothing is "not sent"
        assert by_state(digest) == {"unknown": len(sent_once)}

        # an operator's sweep before any evidence arrives sends nothing again
        assert digest("sweep").code in (0, 1)
        assert provider.held() == sent_once
        assert by_state(digest) == {"unknown": len(sent_once)}

        with ServeProcess({**run_env, **provider.serve_env}) as serve:
            answers = provider.deliver_events(serve.url)
            code, log = serve.stopped()
        assert code == 0, log
        assert {a.status_code for a in answers} == {200}, [a.text for a in answers]
        assert by_state(digest) == {"sent": len(sent_once)}

        # the scheduler's next pass cleans up; the provider still holds one message per key
        sweep = digest("sweep")
        assert sweep.code == 0, sweep.err
        assert by_state(digest) == {"cleaned": len(sent_once)}
        assert provider.held() == sent_once
