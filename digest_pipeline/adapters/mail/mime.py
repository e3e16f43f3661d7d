"""A rendered `Message` as an RFC 5322 message: multipart/alternative, text first, then HTML.

Every mailer sends these bytes or these headers (the outbox stores them, SMTP transmits them, the
HTTP provider gets the same headers), so the headers a receiver uses to detect duplicates are the
same everywhere. `check_message` is the cheap gate every path applies: no header value holds a
line break (header injection), no header line is longer than RFC 5322's 998 characters, and
nothing holds text UTF-8 cannot encode.
"""

import re
from email.headerregistry import BaseHeader, HeaderRegistry, UnstructuredHeader
from email.message import EmailMessage
from email.policy import EmailPolicy
from typing import Any

from digest_pipeline.domain.catalogue import encodable
from digest_pipeline.domain.errors import InvalidRecipient, RenderError
from digest_pipeline.domain.model import Message, key_digest

# RFC 5322 §2.1.1 allows 998 characters a line. Folding at 78 would turn a long, space-less
# List-Unsubscribe URL into an encoded word that receivers' one-click unsubscribe cannot use.
MAX_LINE = 998


#: headers whose every message holds one of a few values (the parts' types and encodings, the
#: sender, the Date of the second it was composed in): parsed once per value; a boundary is new
#: in every message and is never kept
_SHARED = frozenset({"content-type", "content-transfer-encoding", "mime-version", "from", "date"})
_SHARED_KEPT = 64
#: the plain shape of an unstructured value (a subject, the operation key, the unsubscribe
#: link): printable ASCII words and single spaces, `=?` apart (an encoded word's start, which
#: the registry decodes and encodes again); anything else takes the registry's path
_VERBATIM = re.compile(r"[!-~]+(?: [!-~]+)*")
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
#: RFC 5322 dot-atom local part @ a hostname of two labels or more, ASCII only: the common
#: recipient, which the composer takes without parsing and the registry writes back unchanged
PLAIN_ADDRESS = re.compile(rf"{_ATOM}(?:\.{_ATOM})*@{_LABEL}(?:\.{_LABEL})+")


class _HeaderClasses(HeaderRegistry):
    """Python's header registry, each header's class made once instead of at every header.

    `HeaderRegistry.__getitem__` builds a new class with `type()` for every header it parses
    (a large share of serialising a digest); the classes hold no state, so one per
    header name serialises to the same bytes. The headers in `_SHARED` are also parsed once
    per value: a parsed header is an immutable string, so messages can share it.
    """

    def __init__(self) -> None:
        super().__init__()
        self._made: dict[str, type[BaseHeader]] = {}
        self._parsed: dict[tuple[str, str], BaseHeader] = {}

    def __getitem__(self, name: str) -> type[BaseHeader]:
        made = self._made.get(key := name.lower())
        if made is None:
            made = self._made[key] = super().__getitem__(name)
        return made

    def __call__(self, name: str, value: Any) -> BaseHeader:
        if name.lower() not in _SHARED or "boundary" in value:
            return super().__call__(name, value)
        parsed = self._parsed.get(key := (name, value))
        if parsed is None:
            if len(self._parsed) >= _SHARED_KEPT:
                self._parsed.clear()  # the seconds gone by, mostly
            parsed = self._parsed[key] = super().__call__(name, value)
        return parsed


class _WirePolicy(EmailPolicy):
    """`email.policy.SMTP`, but a plain unstructured value or recipient is stored as it is.

    The registry would parse it into a tree and fold the tree back into the same line (a test
    holds the bytes equal to SMTP's), tens of microseconds a header; a raw string is written as
    it is when its line fits, which this one does.
    """

    def header_store_parse(self, name: str, value: Any) -> tuple[str, Any]:
        if (
            type(value) is str
            and len(name) + 2 + len(value) <= MAX_LINE
            and "=?" not in value
            and (
                (_VERBATIM.fullmatch(value) and issubclass(_REGISTRY[name], UnstructuredHeader))
                or (name.lower() == "to" and PLAIN_ADDRESS.fullmatch(value))
            )
        ):
            return name, value
        return super().header_store_parse(name, value)


_REGISTRY = _HeaderClasses()
#: SMTP's policy (CRLF, 8-bit parts) with lines up to RFC 5322's limit
WIRE = _WirePolicy(linesep="\r\n", max_line_length=MAX_LINE, header_factory=_REGISTRY)
#: `WIRE` for a relay without 8BITMIME (RFC 6152): a part that is not ASCII is quoted-printable
#: or base64, whichever is shorter, so every byte sent is 7-bit
SEVEN_BIT = WIRE.clone(cte_type="7bit")

# Exactly the boundaries `str.splitlines()` knows: `email.policy` refuses a header value holding
# one of them, and a receiver may read CR or LF as the start of a new header.
_LINE_BREAK = re.compile("[\r\n\v\f\x1c\x1d\x1e\x85\u2028\u2029]")
# RFC 5322 §2.2: a field name is printable US-ASCII except ':'.
_FIELD_NAME = re.compile(r"[!-9;-~]+")
#: field names joined by tabs, each one `_FIELD_NAME`
_FIELD_NAMES = re.compile(r"[!-9;-~]+(?:\t[!-9;-~]+)*")
#: the position of the recipient's To field in the fields `check_headers` checks
_TO_FIELD = 1


def check_message(message: Message) -> None:
    """Raises RenderError for a header or part no mailer may send; a few µs a message.

    It names the header, never its value, which may hold an address or customer content. A
    refused To header is an `InvalidRecipient`.
    """
    check_headers(message)
    if not (encodable(message.text) and encodable(message.html or "")):
        raise RenderError(f"{message.key}: the body is not valid Unicode")


def check_headers(message: Message) -> None:
    """`check_message` without the parts: for a composer whose parts hold only checked text."""
    fields = (
        ("From", message.sender),
        ("To", message.recipient),  # at _TO_FIELD
        ("Subject", message.subject),
        *message.headers,
    )
    # The common case in one pass over all the headers at once (a tab is neither a line break
    # nor a name character); only a message that fails is looked at header by header, to name
    # the header.
    names = "\t".join(name for name, _ in fields)
    values = "\t".join(value for _, value in fields)
    fine = (
        names.count("\t") == len(fields) - 1  # no name holds the separator itself
        and _FIELD_NAMES.fullmatch(names) is not None
        and _LINE_BREAK.search(values) is None
        and all(len(name) + 2 + len(value) <= MAX_LINE for name, value in fields)
        and encodable(values)
    )
    if not fine:
        _name_the_header(message, fields)


def _name_the_header(message: Message, fields: tuple[tuple[str, str], ...]) -> None:
    """Raises the RenderError of the first header `check_message` refuses."""
    for i, (name, value) in enumerate(fields):
        # the recipient's own field: a customer's data, not something every digest shares
        refused = InvalidRecipient if i == _TO_FIELD else RenderError
        if not _FIELD_NAME.fullmatch(name):
            raise refused(f"{message.key}: a header name is not printable ASCII")
        if _LINE_BREAK.search(value):
            raise refused(f"{message.key}: header {name} holds a line break")
        # `Name: value` unfolded, as the HTTP provider receives it; folding could shorten a
        # Subject with spaces, but never an address or a URL, and no header here needs it
        if len(name) + 2 + len(value) > MAX_LINE:
            raise refused(f"{message.key}: header {name} is longer than {MAX_LINE} characters")
        if not encodable(value):
            raise refused(f"{message.key}: header {name} is not valid Unicode")
    raise RenderError(f"{message.key}: a header cannot be sent")  # the checks above disagree


def build_mime(message: Message, *, seven_bit: bool = False) -> EmailMessage:
    """The message with From/To/Subject, the composer's headers, and both parts.

    A part is 8bit when it is not ASCII, unless `seven_bit` asks for a transfer encoding.
    """
    check_message(message)
    mime = EmailMessage(policy=SEVEN_BIT if seven_bit else WIRE)
    mime["From"] = message.sender
    mime["To"] = message.recipient
    mime["Subject"] = message.subject
    for name, value in message.headers:
        mime[name] = value
    mime.set_content(message.text, subtype="plain", charset="utf-8")
    if message.html is not None:
        mime.add_alternative(message.html, subtype="html", charset="utf-8")
        if (boundary := _boundary(message)) is not None:
            mime.set_boundary(boundary)
    return mime


def _boundary(message: Message) -> str | None:
    """The parts' boundary, named by the operation key; None if a part holds it.

    Python's generator draws one at random and compiles a pattern per message to check the parts
    for it (a noticeable share of serialising a digest); this one is checked with a substring
    search, and the generator still draws one for a part that holds it.
    """
    boundary = "=_" + key_digest(message.key)
    line = f"--{boundary}"
    return None if line in message.text or line in (message.html or "") else boundary


def to_bytes(message: Message, *, seven_bit: bool = False) -> bytes:
    """The wire form (CRLF line endings, as SMTP and Maildir readers expect).

    `seven_bit`: every byte is ASCII, for a relay that does not offer 8BITMIME. Raises
    RenderError, and nothing else, for a message that cannot be serialised: InvalidRecipient
    when its To header alone cannot be.
    """
    try:
        return build_mime(message, seven_bit=seven_bit).as_bytes()
    except RenderError:
        raise
    except Exception as e:
        # Besides ValueError, CPython 3.11's header parser crashes on some malformed addresses
        # with IndexError, AttributeError, TypeError, UnboundLocalError or RecursionError (a
        # sender of "^@" or "x@[", say). Nothing has left when this runs, so a mailer must be
        # able to call it a permanent render error; an exception would read as `unknown`.
        refused = RenderError if _serialises(message.recipient, seven_bit) else InvalidRecipient
        raise refused(f"{message.key}: message cannot be serialised ({type(e).__name__})") from e


def _serialises(recipient: str, seven_bit: bool) -> bool:
    """Whether a To header of `recipient` serialises on its own: whose fault a crash was.

    Only a refused message pays for it; the parser's crashes on a sender are no recipient's.
    """
    probe = EmailMessage(policy=SEVEN_BIT if seven_bit else WIRE)
    try:
        probe["To"] = recipient
        probe.as_bytes()
    except Exception:
        return False
    return True
