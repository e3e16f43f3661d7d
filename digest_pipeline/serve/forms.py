"""The RFC 8058 one-click body: `List-Unsubscribe=One-Click`, form-encoded either way it may come.

RFC 8058 §3.2 lets the mail receiver send it as `multipart/form-data` or as
`application/x-www-form-urlencoded`; both are read here with the standard library (Starlette's
form parser needs python-multipart, a dependency for one field). A bare `text/plain` (or an
untyped) `List-Unsubscribe=One-Click` is accepted too.
"""

from email import policy
from email.message import EmailMessage, Message
from email.parser import BytesParser
from urllib.parse import parse_qs

FIELD, VALUE = "List-Unsubscribe", "One-Click"
ONE_CLICK_BODY = f"{FIELD}={VALUE}"


def _kind(header: str | None) -> str | None:
    """The media type of a Content-Type header, lower-case; None when absent or unreadable."""
    if not header:
        return None
    holder = Message()
    holder["Content-Type"] = header
    kind = holder.get_content_type()
    # `Message` falls back to text/plain for a type it cannot read: say so instead
    return kind if header.strip().lower().startswith(kind) else "unreadable"


def _urlencoded(body: bytes) -> bool:
    try:
        text = body.decode("ascii")
    except UnicodeDecodeError:
        return False
    return VALUE in parse_qs(text, keep_blank_values=True).get(FIELD, [])


def _multipart(header: str, body: bytes) -> bool:
    raw = b"Content-Type: " + header.encode("latin-1", "replace") + b"\r\n\r\n" + body
    try:
        parsed = BytesParser(policy=policy.HTTP).parsebytes(raw)
    except Exception:
        # the email package's parser crashes (IndexError, AttributeError, …) on some inputs
        return False
    if not parsed.is_multipart():
        return False
    for part in parsed.iter_parts() if isinstance(parsed, EmailMessage) else []:
        if part.get_param("name", header="content-disposition") != FIELD:
            continue
        payload = part.get_payload(decode=True)
        if isinstance(payload, bytes) and payload.strip() == VALUE.encode():
            return True
    return False


def is_one_click(content_type: str | None, body: bytes) -> bool:
    """Whether `body`, of `content_type`, is the one-click form (and nothing refuses it)."""
    kind = _kind(content_type)
    if kind == "multipart/form-data" and content_type is not None:
        return _multipart(content_type, body)
    if kind in (None, "application/x-www-form-urlencoded", "text/plain"):
        return _urlencoded(body.strip())
    return False
