"""The digest message the HTTP provider mailers' tests send, and one send of it."""

from digest_pipeline.domain.failures import SendOutcome
from digest_pipeline.domain.model import Message, message_id_for
from digest_pipeline.ports import Mailer
from digest_pipeline_tests.builders import email_of, key_of

#: a `Date` the message carries, which a provider stamps itself (the mailers leave it out)
DATE_HEADER = ("Date", "Mon, 19 Oct 2026 06:00:00 +0000")


def message(
    n: int = 1,
    *,
    html: str | None = "<p>Your picks</p>",
    sender: str = "digest@example.com",
    extra: tuple[tuple[str, str], ...] = (),
) -> Message:
    """Customer `n`'s digest, with the headers every composed digest has and `extra` after them."""
    key = key_of(n)
    return Message(
        key=key,
        recipient=email_of(n),
        sender=sender,
        subject=f"Your weekly picks ({key.period})",
        text="Your picks",
        html=html,
        headers=(
            ("Message-ID", message_id_for(key)),
            ("X-Digest-Operation-Key", str(key)),
            *extra,
        ),
    )


def send(mailer: Mailer, msg: Message) -> SendOutcome:
    """One send of `msg` under its own operation key, as the deliverer sends it."""
    return mailer.send(msg, idempotency_key=str(msg.key))
