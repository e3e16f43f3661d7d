"""The SMTP mailer against a real aiosmtpd server on loopback (no PostgreSQL: default suite).

Each scripted reply or network event must come back as the right failure class; the bytes the
server stores must parse back to the message; connections are reused and reopened after errors;
nothing an outcome or a log line says holds an address or a password.
"""

import email
import email.policy
import logging
import socket
import ssl
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from digest_pipeline.adapters.mail.smtp import SmtpMailer
from digest_pipeline.domain.failures import FailureClass
from digest_pipeline.domain.model import LookupStatus, Message, message_id_for
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.settings import SmtpSettings
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.smtp_peer import (
    Action,
    DropAfterBody,
    HangAfterBody,
    Reply,
    SmtpPeer,
    loopback_settings,
    self_signed_tls,
    smtp_peer_fixture,  # noqa: F401  (provides the `smtp_peer` fixture)
)

T, THR, P, U = (
    FailureClass.TRANSIENT,
    FailureClass.THROTTLED,
    FailureClass.PERMANENT,
    FailureClass.UNKNOWN,
)
PASSWORD = "pw-7Hq-secret"


def message(n: int = 1, **overrides: object) -> Message:
    key = OperationKey(W42, f"customer-{n}")
    values: dict[str, object] = {
        "key": key,
        "recipient": f"c{n}@example.test",
        "sender": "digest@example.com",
        "subject": f"Your weekly picks ({W42})",
        "text": "Hello!\n\n- Lamp — 19.90 EUR\n  https://shop.example/p/1\n",
        "html": "<p>Hello!</p><ul><li>Lamp &mdash; 19.90 EUR</li></ul>",
        "headers": (
            ("Message-ID", message_id_for(key)),
            ("X-Digest-Operation-Key", str(key)),
            ("List-Unsubscribe", f"<https://shop.example/unsubscribe/customer-{n}?token=t>"),
        ),
    }
    return Message(**(values | overrides))  # type: ignore[arg-type]


def _lines(text: str | None) -> list[str]:
    return (text or "").replace("\r\n", "\n").rstrip("\n").split("\n")


def send(mailer: SmtpMailer, msg: Message):
    return mailer.send(msg, idempotency_key=str(msg.key))


@pytest.fixture
def make_mailer() -> Iterator[Callable[..., SmtpMailer]]:
    made: list[SmtpMailer] = []

    def make(settings: SmtpSettings, **kwargs: object) -> SmtpMailer:
        made.append(SmtpMailer(settings, **kwargs))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for mailer in made:
        mailer.close()


@pytest.fixture
def mailer(smtp_peer: SmtpPeer, make_mailer: Callable[..., SmtpMailer]) -> SmtpMailer:
    return make_mailer(smtp_peer.settings(timeout_seconds=0.5))


@pytest.fixture(scope="module")
def tls_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    return self_signed_tls(tmp_path_factory.mktemp("tls"))


# -- classification -----------------------------------------------------------------------
REPLIES = [
    # code, enhanced status in the scripted text, expected class (RFC 5321 §4.2, RFC 3463)
    (421, "4.3.2", T),  # service closing the channel
    (450, "4.2.1", T),  # mailbox busy
    (451, "4.3.0", T),  # local error
    (452, "4.5.3", THR),  # too many recipients / storage: slow down
    (454, "4.7.0", THR),  # temporary failure: rate limited
    (550, "5.1.1", P),  # unknown user
    (551, "5.1.6", P),  # user not local
    (552, "5.3.4", P),  # too big
    (553, "5.1.3", P),  # mailbox name not allowed
    (554, "5.7.1", P),  # transaction failed
]


@pytest.mark.parametrize("stage", ["rcpt", "data"])
@pytest.mark.parametrize(("code", "enhanced", "expected"), REPLIES)
def test_scripted_reply_maps_to_its_failure_class(
    mailer, smtp_peer, stage, code, enhanced, expected
):
    smtp_peer.script("c1@example.test", Reply(code, stage))

    outcome = send(mailer, message())

    assert (outcome.accepted, outcome.failure_class) == (False, expected)
    assert outcome.detail == f"smtp:{code}:{enhanced}"
    assert outcome.retry_after is None
    assert smtp_peer.messages == []


@pytest.mark.parametrize(
    ("action", "detail"),
    [
        (HangAfterBody(), "smtp:timeout_after_data"),
        (DropAfterBody(), "smtp:dropped_after_data"),
    ],
)
def test_silence_after_the_body_is_unknown_though_the_server_stored_it(
    mailer, smtp_peer, action, detail
):
    smtp_peer.script("c1@example.test", action)

    outcome = send(mailer, message())

    assert (outcome.failure_class, outcome.detail) == (U, detail)
    assert [m.rcpt_tos for m in smtp_peer.messages] == [("c1@example.test",)]


def test_closed_port_is_transient(make_mailer):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mailer = make_mailer(loopback_settings(port))

    outcome = send(mailer, message())

    assert (outcome.failure_class, outcome.detail) == (T, "smtp:connect_refused")


def test_server_that_never_greets_is_a_transient_timeout(make_mailer):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()  # the kernel completes the handshake; nobody ever speaks
        settings = loopback_settings(listener.getsockname()[1], timeout_seconds=0.3)

        outcome = send(make_mailer(settings), message())

    assert (outcome.failure_class, outcome.detail) == (T, "smtp:connect_timeout")


@pytest.mark.parametrize(
    ("peer_kwargs", "overrides", "expected"),
    [
        ({"credentials": ("digest", PASSWORD)}, {"password": "wrong"}, (P, "smtp:535:5.7.8")),
        ({}, {"password": PASSWORD}, (P, "smtp:auth_unsupported")),
        ({}, {"security": "starttls"}, (P, "smtp:starttls_unsupported")),
    ],
    ids=["bad-password", "no-auth-offered", "no-starttls-offered"],
)
def test_session_setup_refusals_are_permanent(make_mailer, peer_kwargs, overrides, expected):
    with SmtpPeer(**peer_kwargs) as peer:
        settings = peer.settings(**({"username": "digest"} | overrides))
        outcome = send(make_mailer(settings), message())

        assert (outcome.failure_class, outcome.detail) == expected
        assert peer.messages == []


@pytest.mark.parametrize(
    "bad",
    [
        message(headers=(("X-Digest-Operation-Key", "a\r\nBcc: x@evil.test"),)),
        message(subject="hi\u2028Bcc: x@evil.test"),
        message(text="picks \ud800"),
        # the email package's parser crashes on these senders (IndexError, AttributeError)
        message(sender="^@"),
        message(sender="x@["),
    ],
    ids=["crlf", "unicode-line-break", "lone-surrogate", "parser-index-error", "parser-attr-error"],
)
def test_render_error_is_permanent_and_nothing_is_sent(mailer, smtp_peer, bad):
    outcome = send(mailer, bad)

    assert (outcome.failure_class, outcome.detail) == (P, "render_error")
    assert smtp_peer.connections == 0
    assert smtp_peer.messages == []


def test_a_recipient_smtp_cannot_carry_is_a_permanent_invalid_recipient(mailer, smtp_peer):
    outcome = send(mailer, message(recipient="jürgen@example.test"))

    assert (outcome.failure_class, outcome.detail) == (P, "invalid_recipient")
    assert smtp_peer.connections == 0


def test_a_sender_smtp_cannot_carry_is_a_permanent_configuration_fault(mailer, smtp_peer):
    outcome = send(mailer, message(sender="dïgest@example.test"))

    assert (outcome.failure_class, outcome.detail) == (P, "smtp:bad_envelope_sender")
    assert smtp_peer.connections == 0


# -- what the server received -------------------------------------------------------------
def test_accepted_message_parses_back_with_headers_and_both_parts(mailer, smtp_peer):
    msg = message(text="Hello!\n.\n..starts with dots\n- Lamp — 19.90 EUR\n")

    outcome = send(mailer, msg)

    assert outcome.accepted
    assert outcome.provider_message_id == message_id_for(msg.key)
    [received] = smtp_peer.messages
    assert (received.mail_from, received.rcpt_tos) == ("digest@example.com", ("c1@example.test",))
    parsed = email.message_from_bytes(received.raw, policy=email.policy.default)
    assert parsed["From"] == msg.sender
    assert parsed["To"] == msg.recipient
    assert parsed["Subject"] == msg.subject
    for name, value in msg.headers:
        assert parsed[name] == value
    assert parsed.get_content_type() == "multipart/alternative"
    plain, html = parsed.get_body(("plain",)), parsed.get_body(("html",))
    assert plain is not None
    assert html is not None
    assert _lines(plain.get_content()) == _lines(msg.text)
    assert _lines(html.get_content()) == _lines(msg.html)


def test_envelope_sender_is_the_address_of_a_named_sender(mailer, smtp_peer):
    assert send(mailer, message(sender="Shop Digest <digest@example.com>")).accepted
    assert smtp_peer.messages[0].mail_from == "digest@example.com"


# -- connections --------------------------------------------------------------------------
def test_one_connection_carries_a_batch(mailer, smtp_peer):
    outcomes = [send(mailer, message(n)) for n in range(1, 6)]

    assert all(o.accepted for o in outcomes)
    assert len(smtp_peer.messages) == 5
    assert smtp_peer.connections == 1


@pytest.mark.parametrize(
    ("action", "connections"),
    [
        (Reply(550, "rcpt"), 1),  # a clean refusal: RSET, keep the connection
        (Reply(451, "data"), 1),
        (Reply(421, "rcpt"), 2),  # the server is closing the channel
        (DropAfterBody(), 2),
        (HangAfterBody(), 2),
    ],
    ids=["550-rcpt", "451-data", "421-rcpt", "drop", "hang"],
)
def test_connection_is_reopened_after_an_error_and_kept_after_a_refusal(
    mailer, smtp_peer, action: Action, connections
):
    smtp_peer.script("c2@example.test", action)

    outcomes = [send(mailer, message(n)) for n in (1, 2, 3)]

    assert [o.accepted for o in outcomes] == [True, False, True]
    assert smtp_peer.connections == connections
    assert [m.rcpt_tos[0] for m in smtp_peer.messages if m.rcpt_tos[0] != "c2@example.test"] == [
        "c1@example.test",
        "c3@example.test",
    ]


def test_close_ends_the_connection_and_a_later_send_reconnects(mailer, smtp_peer):
    assert send(mailer, message(1)).accepted
    mailer.close()
    assert send(mailer, message(2)).accepted

    assert smtp_peer.connections == 2


def test_threads_get_their_own_connections(mailer, smtp_peer):
    with ThreadPoolExecutor(max_workers=4) as pool:
        outcomes = list(pool.map(lambda n: send(mailer, message(n)), range(1, 25)))

    assert all(o.accepted for o in outcomes)
    assert len(smtp_peer.messages) == 24
    assert 1 <= smtp_peer.connections <= 4


def test_construction_does_no_io():
    unreachable = SmtpSettings("unreachable.invalid", 25, "u", PASSWORD, "tls", 0.1)

    mailer = SmtpMailer(unreachable)

    assert mailer.capabilities.idempotency_window is None
    assert not mailer.capabilities.can_lookup
    assert mailer.lookup("digest:2026-W42:customer-1").status is LookupStatus.UNSUPPORTED
    mailer.close()


# -- secrets ------------------------------------------------------------------------------
def test_details_and_logs_never_hold_the_address_or_the_password(make_mailer, caplog):
    caplog.set_level(logging.DEBUG)
    with SmtpPeer(credentials=("digest", PASSWORD)) as peer:
        good = make_mailer(peer.settings(username="digest", password=PASSWORD))
        bad = make_mailer(peer.settings(username="digest", password=PASSWORD + "x"))
        peer.script("c2@example.test", Reply(550, "rcpt"))
        peer.script("c3@example.test", Reply(554, "data"))
        peer.script("c4@example.test", DropAfterBody())
        outcomes = [send(good, message(n)) for n in (1, 2, 3, 4)] + [send(bad, message(5))]

    assert [o.label for o in outcomes] == ["sent", "permanent", "permanent", "unknown", "permanent"]
    ours = [r.getMessage() for r in caplog.records if r.name.startswith("digest_pipeline")]
    assert len(ours) == 4
    for text in [o.detail for o in outcomes] + ours:
        assert "example.test" not in text
        assert "pw-7Hq" not in text


# -- TLS ----------------------------------------------------------------------------------
def test_starttls_with_login(make_mailer, tls_pair):
    server_tls, client_tls = tls_pair
    with SmtpPeer(tls=server_tls, credentials=("digest", PASSWORD)) as peer:
        settings = peer.settings(security="starttls", username="digest", password=PASSWORD)
        mailer = make_mailer(settings, ssl_context=client_tls)

        assert send(mailer, message(1)).accepted
        assert send(mailer, message(2)).accepted
        assert (len(peer.messages), peer.connections) == (2, 1)


def test_implicit_tls(make_mailer, tls_pair):
    server_tls, client_tls = tls_pair
    with SmtpPeer(tls=server_tls, implicit_tls=True) as peer:
        mailer = make_mailer(peer.settings(security="tls"), ssl_context=client_tls)

        assert send(mailer, message()).accepted
        assert len(peer.messages) == 1


def test_untrusted_certificate_is_transient_and_sends_nothing(make_mailer, tls_pair):
    server_tls, _ = tls_pair
    with SmtpPeer(tls=server_tls, implicit_tls=True) as peer:
        mailer = make_mailer(peer.settings(security="tls"))  # the system CAs only

        outcome = send(mailer, message())

        assert (outcome.failure_class, outcome.detail) == (T, "smtp:tls_verify_failed")
        assert peer.messages == []
