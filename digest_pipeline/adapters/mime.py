"""A rendered `Message` as an RFC 5322 message: multipart/alternative, text first, then HTML.

Every mailer sends these bytes (the outbox stores them, SMTP transmits them, the HTTP provider
gets the same headers), so the headers a receiver uses to detect duplicates are the same
everywhere. Header values holding CR or LF are refused: that is header injection.
"""

from email.message import EmailMessage
from email.policy import SMTP

from digest_pipeline.domain.errors import RenderError
from digest_pipeline.domain.model import Message

# RFC 5322 §2.1.1 allows 998 characters a line. Folding at 78 would turn a long, space-less
# List-Unsubscribe URL into an encoded word that receivers' one-click unsubscribe cannot use.
WIRE = SMTP.clone(max_line_length=998)


def _header(value: str, name: str, message: Message) -> str:
    if "\r" in value or "\n" in value:
        raise RenderError(f"{message.key}: header {name} holds a line break")
    return value


def build_mime(message: Message) -> EmailMessage:
    """The message with From/To/Subject, the composer's headers, and both parts."""
    mime = EmailMessage(policy=WIRE)
    mime["From"] = _header(message.sender, "From", message)
    mime["To"] = _header(message.recipient, "To", message)
    mime["Subject"] = _header(message.subject, "Subject", message)
    for name, value in message.headers:
        mime[name] = _header(value, name, message)
    mime.set_content(message.text, subtype="plain", charset="utf-8")
    if message.html is not None:
        mime.add_alternative(message.html, subtype="html", charset="utf-8")
    return mime


def to_bytes(message: Message) -> bytes:
    """The wire form (CRLF line endings, as SMTP and Maildir readers expect)."""
    try:
        return build_mime(message).as_bytes()
    except (ValueError, TypeError) as e:
        # the email package refuses malformed addresses and header values this way
        raise RenderError(
            f"{message.key}: message cannot be serialised ({type(e).__name__})"
        ) from e
