"""One rig per mailer: its real peer on loopback, the provider-neutral faults in the peer's words.

A rig starts the peer, makes the mailer that talks to it, turns a `Fault` into the peer's own
answer (Resend's JSON errors, Postmark's ErrorCode bodies, SendGrid's errors array, SMTP reply
codes), counts what the peer holds for a key, and settles an `unknown` send with the evidence the
mailer's design relies on. A fault the peer cannot produce is declared in `cannot` with the
reason, so the suite skips it by name instead of passing it silently.
"""

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from enum import Enum, StrEnum
from pathlib import Path
from typing import ClassVar, Self

from sqlalchemy import Engine

from digest_pipeline.adapters.mail.http import HttpProviderMailer
from digest_pipeline.adapters.mail.outbox import OutboxMailer, stored_headers, stored_key
from digest_pipeline.adapters.mail.postmark import PostmarkMailer
from digest_pipeline.adapters.mail.provider_client import ProviderClientMailer
from digest_pipeline.adapters.mail.sendgrid import SendGridMailer
from digest_pipeline.adapters.mail.smtp import SmtpMailer
from digest_pipeline.adapters.sql.feedback import SqlFeedbackStore, concurrent_callers
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.domain.failures import FailureClass
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.ports import Mailer
from digest_pipeline.rigs.servers import postmark_server
from digest_pipeline.rigs.servers.loopback import free_port
from digest_pipeline.rigs.servers.postmark_server import PostmarkServer
from digest_pipeline.rigs.servers.provider_actions import (
    Action,
    status,
    store_then_drop,
    store_then_hang,
)
from digest_pipeline.rigs.servers.provider_server import ProviderServer
from digest_pipeline.rigs.servers.sendgrid_server import SendGridServer
from digest_pipeline.serve.app import ServeConfig, build_app
from digest_pipeline.serve.server import BackgroundServer
from digest_pipeline.services.deliver import Deliverer
from digest_pipeline.services.reconcile import reconcile_period
from digest_pipeline.services.resolve import resolve_unknown
from digest_pipeline.services.wave import DeliveryReport
from digest_pipeline.settings import ProviderSettings, load_settings
from digest_pipeline_tests.builders import deliver_all, email_of, make_deliverer
from digest_pipeline_tests.conftest import T0
from digest_pipeline_tests.fakes import FakeMailer, FaultInjectingMailer, FixedClock
from digest_pipeline_tests.smtp_peer import (
    DropAfterBody,
    HangAfterBody,
    Reply,
    SmtpPeer,
    loopback_settings,
)

#: every client's timeout: long enough for loopback, short enough that a hang costs little
TIMEOUT = 0.5
#: how long a peer stays silent on a hang: well past TIMEOUT (it stops waiting at shutdown)
HANG = 5.0


class Fault(StrEnum):
    """What can go wrong with one send, in no provider's words."""

    #: the provider asks us to slow down
    RATE_LIMITED = "rate_limited"
    #: the provider failed and took nothing
    SERVER_ERROR = "server_error"
    #: the provider refuses this recipient
    RECIPIENT_REFUSED = "recipient_refused"
    #: the provider refuses this message
    CONTENT_REFUSED = "content_refused"
    #: the provider refuses our credentials (the key was revoked)
    CREDENTIAL_REFUSED = "credential_refused"
    #: nothing listens where the mailer connects
    NEVER_CONNECTED = "never_connected"
    #: the peer took the message and stays silent past the client's timeout
    TIMEOUT_BEFORE_ANSWER = "timeout_before_answer"
    #: the peer took the message, then the connection drops before the answer
    ANSWER_LOST = "answer_lost"


#: the one failure class every mailer must report for each fault (design §2)
EXPECTED: Mapping[Fault, FailureClass] = {
    Fault.RATE_LIMITED: FailureClass.THROTTLED,
    Fault.SERVER_ERROR: FailureClass.TRANSIENT,
    Fault.RECIPIENT_REFUSED: FailureClass.PERMANENT,
    Fault.CONTENT_REFUSED: FailureClass.PERMANENT,
    # and domain/breaker reads it as a credential refusal: retried once the sender is fixed
    Fault.CREDENTIAL_REFUSED: FailureClass.PERMANENT,
    Fault.NEVER_CONNECTED: FailureClass.TRANSIENT,
    Fault.TIMEOUT_BEFORE_ANSWER: FailureClass.UNKNOWN,
    Fault.ANSWER_LOST: FailureClass.UNKNOWN,
}
#: how many messages the peer holds for the key after the fault
HELD_AFTER: Mapping[Fault, int] = {
    fault: 1 if fault in (Fault.TIMEOUT_BEFORE_ANSWER, Fault.ANSWER_LOST) else 0 for fault in Fault
}


class Setup(Enum):
    """A fault that is the peer's state rather than its answer to one request."""

    #: the peer revokes the mailer's credential: its own refusal of a bad credential answers
    REVOKED_CREDENTIAL = "revoked_credential"
    #: the mailer is pointed at a loopback port nobody listens on
    CLOSED_PORT = "closed_port"


def peerless(mailer: str, answers: Mapping[Fault, object]) -> dict[Fault, str]:
    """The faults a mailer without a remote peer (the fake, the outbox) cannot meet, with why."""
    why = f"the {mailer} has no remote peer to throttle, fail, refuse or become unreachable"
    return {fault: why for fault in Fault if fault not in answers}


def recipient_of(key: OperationKey) -> str:
    """The address `rigs.seeding` gives the numbered customer of `key` (`customer-0007`)."""
    return email_of(int(key.customer_id.removeprefix("customer-")))


@dataclass
class World:
    """A SQLite ledger with its fixed clock and policy: what delivery and its later paths share."""

    engine: Engine
    clock: FixedClock = field(default_factory=lambda: FixedClock(T0))
    policy: DeliveryPolicy = field(default_factory=DeliveryPolicy)
    ledger: SqlLedger = field(init=False)

    def __post_init__(self) -> None:
        self.ledger = SqlLedger(self.engine)

    def deliverer(self, mailer: Mailer) -> Deliverer:
        return make_deliverer(self.ledger, mailer, self.clock, policy=self.policy)

    def deliver(self, mailer: Mailer) -> DeliveryReport:
        """One delivery run over everything due now."""
        return deliver_all(self.deliverer(mailer), batch_size=10)


class MailerRig(ABC):
    """A mailer and its peer; a context manager that starts the peer and closes every mailer."""

    #: the mailer's `DIGEST_MAILER` name
    name: ClassVar[str]
    #: each fault this peer can produce, and its answer (a peer action or a `Setup`)
    answers: ClassVar[Mapping[Fault, object]]
    #: each fault this peer cannot produce, and why
    cannot: ClassVar[Mapping[Fault, str]] = {}
    #: the wait the peer states with RATE_LIMITED, where its answer states one
    stated_wait: ClassVar[timedelta | None] = None
    #: whether the reconciler proves an ambiguous send by itself (a lookup, an idempotent resend)
    proves_send: ClassVar[bool]
    #: what `settle` returns: the evidence that settles this mailer's `unknown` sends
    evidence: ClassVar[str]

    def __init__(self, tmp_path: Path) -> None:
        self._tmp = tmp_path
        self._reachable = True
        self._mailers: dict[bool, Mailer] = {}

    def __enter__(self) -> Self:
        self._start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            for mailer in self._mailers.values():
                mailer.close()
        finally:
            self._stop()

    # -- what the suite uses -----------------------------------------------------------------
    def mailer(self) -> Mailer:
        """The mailer as configured for the peer (one instance, so one identity, per target)."""
        if self._reachable not in self._mailers:
            self._mailers[self._reachable] = self._new_mailer(self._reachable)
        return self._mailers[self._reachable]

    def script(self, key: OperationKey, fault: Fault) -> None:
        """The peer meets the next send of `key` with `fault`.

        A `Setup` fault is the peer's state, so it meets every later send: a revoked credential,
        or the closed port that `mailer()` then targets.
        """
        if fault not in self.answers:
            raise ValueError(f"{self.name} cannot produce {fault}: {self.cannot.get(fault)}")
        answer = self.answers[fault]
        if answer is Setup.CLOSED_PORT:
            self._reachable = False
        elif answer is Setup.REVOKED_CREDENTIAL:
            self._revoke()
        else:
            self._script(key, answer)

    @abstractmethod
    def held(self, key: OperationKey) -> int:
        """How many messages the peer holds for `key`: its own store, not the mailer's word."""

    def message_id(self, key: OperationKey) -> str | None:
        """The id the peer gave `key`'s first message; None where settling records no id."""
        return None

    def settle(self, world: World, key: OperationKey) -> str:
        """Settles `key`'s `unknown` send with this mailer's evidence; returns the evidence.

        By default the reconciler's (a lookup, an idempotent resend), then a delivery run.
        """
        mailer = self.mailer()
        report = reconcile_period(world.ledger, mailer, world.clock, world.policy, key.period)
        world.deliver(mailer)
        return ",".join(sorted(report.evidence))

    # -- each rig's own ----------------------------------------------------------------------
    @abstractmethod
    def _start(self) -> None: ...

    def _stop(self) -> None:  # noqa: B027 - a rig without a peer has nothing to stop
        """Stops the peer."""

    @abstractmethod
    def _new_mailer(self, reachable: bool) -> Mailer: ...

    @abstractmethod
    def _script(self, key: OperationKey, answer: object) -> None: ...

    def _revoke(self) -> None:
        raise NotImplementedError(f"{self.name} has no credential to revoke")


class _ApiRig(MailerRig):
    """A provider's JSON API on loopback; the three differ in server, mailer and words."""

    server_type: ClassVar[type[ProviderServer | PostmarkServer | SendGridServer]]
    mailer_type: ClassVar[type[ProviderClientMailer]]
    #: the server's attribute that holds the one credential it accepts
    credential: ClassVar[str] = "api_key"
    #: the provider's idempotency window (its mailer reads it only where there is one)
    window: ClassVar[timedelta] = timedelta(hours=24)

    def _start(self) -> None:
        self.server = self.server_type().start()
        self._key: str = getattr(self.server, self.credential)

    def _stop(self) -> None:
        self.server.stop()

    def _new_mailer(self, reachable: bool) -> Mailer:
        url = self.server.url if reachable else f"http://127.0.0.1:{free_port()}"
        return self.mailer_type(ProviderSettings(url, self._key, TIMEOUT, self.window))

    def _script(self, key: OperationKey, answer: object) -> None:
        assert isinstance(answer, Action)
        self.server.script(key, answer)

    def _revoke(self) -> None:
        setattr(self.server, self.credential, "revoked-credential-0000")

    def held(self, key: OperationKey) -> int:
        assert not isinstance(self.server, PostmarkServer)
        return self.server.delivered_count(key)

    def message_id(self, key: OperationKey) -> str | None:
        assert not isinstance(self.server, PostmarkServer)
        return self.server.message_id(key)


class HttpRig(_ApiRig):
    """Resend's `POST /emails` with an Idempotency-Key (provider_server.py)."""

    name, server_type, mailer_type = "http", ProviderServer, HttpProviderMailer
    answers: ClassVar[Mapping[Fault, object]] = {
        Fault.RATE_LIMITED: status(429, "rate_limit_exceeded", retry_after=30),
        Fault.SERVER_ERROR: status(500, "internal_server_error"),
        # Resend's answer to a `to` it cannot address
        Fault.RECIPIENT_REFUSED: status(422, "validation_error"),
        Fault.CREDENTIAL_REFUSED: Setup.REVOKED_CREDENTIAL,
        Fault.NEVER_CONNECTED: Setup.CLOSED_PORT,
        Fault.TIMEOUT_BEFORE_ANSWER: store_then_hang(HANG),
        Fault.ANSWER_LOST: store_then_drop(),
    }
    cannot: ClassVar[Mapping[Fault, str]] = {
        Fault.CONTENT_REFUSED: "Resend answers no refusal of a message for its content: its "
        "4xx errors name a request field, the key or the account",
    }
    stated_wait = timedelta(seconds=30)
    proves_send, evidence = True, "idempotent_resend"


class PostmarkRig(_ApiRig):
    """Postmark's `POST /email`, no key, looked up by Metadata search (postmark_server.py)."""

    name, server_type, mailer_type = "postmark", PostmarkServer, PostmarkMailer
    credential = "token"
    answers: ClassVar[Mapping[Fault, object]] = {
        Fault.RATE_LIMITED: postmark_server.error(429, 429),
        Fault.SERVER_ERROR: postmark_server.error(500, 0),
        # 406: the recipient is inactive (bounced, complained, unsubscribed)
        Fault.RECIPIENT_REFUSED: postmark_server.error(422, 406),
        # 300: invalid email request
        Fault.CONTENT_REFUSED: postmark_server.error(422, 300),
        Fault.CREDENTIAL_REFUSED: Setup.REVOKED_CREDENTIAL,
        Fault.NEVER_CONNECTED: Setup.CLOSED_PORT,
        Fault.TIMEOUT_BEFORE_ANSWER: store_then_hang(HANG),
        Fault.ANSWER_LOST: store_then_drop(),
    }
    proves_send, evidence = True, "mailer_lookup_found"

    def held(self, key: OperationKey) -> int:
        assert isinstance(self.server, PostmarkServer)
        return len(self.server.messages_for(key))

    def message_id(self, key: OperationKey) -> str | None:
        assert isinstance(self.server, PostmarkServer)
        found = self.server.messages_for(key)
        return found[0].message_id if found else None


class SendGridRig(_ApiRig):
    """SendGrid's v3 mail send: no key, no lookup, settled by its signed Event Webhook."""

    name, server_type, mailer_type = "sendgrid", SendGridServer, SendGridMailer
    window = timedelta(0)  # SendGrid has none
    answers: ClassVar[Mapping[Fault, object]] = {
        # X-RateLimit-Reset 30 s ahead
        Fault.RATE_LIMITED: status(429, retry_after=30),
        Fault.SERVER_ERROR: status(500),
        Fault.RECIPIENT_REFUSED: status(400, "personalizations.0.to.0.email"),
        Fault.CONTENT_REFUSED: status(400, "content"),
        Fault.CREDENTIAL_REFUSED: Setup.REVOKED_CREDENTIAL,
        Fault.NEVER_CONNECTED: Setup.CLOSED_PORT,
        Fault.TIMEOUT_BEFORE_ANSWER: store_then_hang(HANG),
        Fault.ANSWER_LOST: store_then_drop(),
    }
    stated_wait = timedelta(seconds=30)
    proves_send, evidence = False, "provider_event"

    def settle(self, world: World, key: OperationKey) -> str:
        """SendGrid posts a signed `delivered` event to `digest serve`'s application."""
        assert isinstance(self.server, SendGridServer)
        # the verification key as `digest serve` reads it from DIGEST_WEBHOOK_SECRETS
        secrets = f"sendgrid={self.server.event_verification_key()}"
        keys = load_settings({"DIGEST_WEBHOOK_SECRETS": secrets}, Path(".")).webhook_keys()
        config = ServeConfig(
            unsubscribe_secret="a-private-secret-for-contract-tests",
            webhook_keys=keys,
            ledger_threads=concurrent_callers(world.engine),
        )
        store, ledger = SqlFeedbackStore(world.engine), world.ledger
        app = build_app(config=config, store=store, ledger=ledger, queue=ledger, clock=world.clock)
        stamp = int(world.clock.now().timestamp())
        with BackgroundServer(app) as site:
            url = f"{site.url}/events/sendgrid"
            answer = self.server.send_event(url, "delivered", key, timestamp=stamp)
        if (answer.status_code, answer.json()) != (200, {"recorded": 1, "unread": 0}):
            raise AssertionError(f"the event webhook answered {answer.status_code} {answer.text}")
        return self.evidence


class SmtpRig(MailerRig):
    """An SMTP relay with AUTH (aiosmtpd, smtp_peer.py), scripted by recipient."""

    name = "smtp"
    answers: ClassVar[Mapping[Fault, object]] = {
        Fault.RATE_LIMITED: Reply(454, "rcpt"),
        # a refusal after the body: nothing was queued, so it is no ambiguity
        Fault.SERVER_ERROR: Reply(451, "data"),
        Fault.RECIPIENT_REFUSED: Reply(550, "rcpt"),
        # 552 5.3.4: the message exceeds the relay's size limit
        Fault.CONTENT_REFUSED: Reply(552, "data"),
        Fault.CREDENTIAL_REFUSED: Setup.REVOKED_CREDENTIAL,
        Fault.NEVER_CONNECTED: Setup.CLOSED_PORT,
        Fault.TIMEOUT_BEFORE_ANSWER: HangAfterBody(HANG),
        Fault.ANSWER_LOST: DropAfterBody(),
    }
    proves_send, evidence = False, "operator_resolution"
    LOGIN = ("digest", "pw-contract-7Hq")

    def _start(self) -> None:
        self.peer = SmtpPeer(credentials=self.LOGIN)
        self.peer.start()

    def _stop(self) -> None:
        self.peer.stop()

    def _new_mailer(self, reachable: bool) -> Mailer:
        user, password = self.LOGIN
        port = self.peer.port if reachable else free_port()
        settings = loopback_settings(
            port, username=user, password=password, timeout_seconds=TIMEOUT
        )
        return SmtpMailer(settings)

    def _script(self, key: OperationKey, answer: object) -> None:
        assert isinstance(answer, Reply | HangAfterBody | DropAfterBody)
        self.peer.script(recipient_of(key), answer, times=1)

    def _revoke(self) -> None:
        self.peer.revoke_login()

    def held(self, key: OperationKey) -> int:
        return self.peer.delivered_count(str(key))

    def settle(self, world: World, key: OperationKey) -> str:
        """SMTP has no key and no lookup: an operator resolves it from the relay's own log."""
        queued = self.held(key) > 0
        resolve_unknown(
            world.ledger,
            world.clock,
            key,
            sent=queued,
            reason="the relay's log shows the message queued" if queued else "not in the log",
            operator="ops-on-call",
        )
        return self.evidence


class FakeRig(MailerRig):
    """The services tier's `FakeMailer`: an idempotent provider with a lookup, in memory."""

    name = "fake"
    answers: ClassVar[Mapping[Fault, object]] = {
        Fault.TIMEOUT_BEFORE_ANSWER: FakeMailer.ACCEPTED_THEN_TIMEOUT,
        Fault.ANSWER_LOST: FakeMailer.ACCEPTED_THEN_TIMEOUT,
    }
    cannot: ClassVar[Mapping[Fault, str]] = peerless("fake", answers)
    proves_send, evidence = True, "mailer_lookup_found"

    def _start(self) -> None:
        self.fake = FakeMailer()

    def _new_mailer(self, reachable: bool) -> Mailer:
        return self.fake

    def _script(self, key: OperationKey, answer: object) -> None:
        self.fake.script_timeout_after_accept(key)

    def held(self, key: OperationKey) -> int:
        return self.fake.deliveries_for(key)

    def message_id(self, key: OperationKey) -> str | None:
        ids = [pid for k, pid, _ in self.fake.deliveries if k == str(key)]
        return ids[0] if ids else None


class OutboxRig(MailerRig):
    """The Maildir outbox; the answer is lost after the file is linked (FaultInjectingMailer)."""

    name = "outbox"
    answers: ClassVar[Mapping[Fault, object]] = {
        Fault.TIMEOUT_BEFORE_ANSWER: "timeout",
        Fault.ANSWER_LOST: "timeout",
    }
    cannot: ClassVar[Mapping[Fault, str]] = peerless("outbox", answers)
    proves_send, evidence = True, "mailer_lookup_found"

    def _start(self) -> None:
        self.outbox = OutboxMailer(self._tmp / "outbox")
        self.faulty = FaultInjectingMailer(self.outbox)

    def _new_mailer(self, reachable: bool) -> Mailer:
        return self.faulty

    def _script(self, key: OperationKey, answer: object) -> None:
        self.faulty.timeout_after_accept(key)

    def _files(self, key: OperationKey) -> list[Path]:
        # a file is a key's delivery when it names the key, whatever the file is called
        return [p for p in self.outbox.stored() if stored_key(p) == str(key)]

    def held(self, key: OperationKey) -> int:
        return len(self._files(key))

    def message_id(self, key: OperationKey) -> str | None:
        files = self._files(key)
        return stored_headers(files[0])["Message-ID"] if files else None
