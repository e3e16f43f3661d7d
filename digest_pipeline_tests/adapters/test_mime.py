import re
import sys
from email import message_from_bytes
from email.policy import SMTP, default
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from digest_pipeline.adapters.mail import mime
from digest_pipeline.adapters.mail.mime import check_message, to_bytes
from digest_pipeline.domain.errors import RenderError
from digest_pipeline.domain.model import Message
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline_tests.conftest import W42

KEY = OperationKey(W42, "customer-0001")
LONG_URL = "https://shop.example/unsubscribe/customer-0001?token=" + "e" * 64
#: every character `str.splitlines()` breaks at: what `email.policy` refuses in a header value
LINE_BREAKS = [c for c in map(chr, range(sys.maxunicode + 1)) if len(f"a{c}b".splitlines()) > 1]
#: senders CPython 3.11's header parser crashes on with something other than a ValueError
CRASHING_SENDERS = [
    pytest.param("^@", id="IndexError"),
    pytest.param("x@[", id="AttributeError"),
    # deep enough to crash the parser, short enough to pass the 998-character line check
    pytest.param("(" * 900 + "digest@example.com", id="RecursionError"),
]


def message(**overrides: object) -> Message:
    values: dict[str, object] = {
        "key": KEY,
        "recipient": "a@example.test",
        "sender": "digest@example.com",
        "subject": "Subject",
        "text": "text",
        "html": "<p>html</p>",
        "headers": (("List-Unsubscribe", f"<{LONG_URL}>"),),
    }
    return Message(**(values | overrides))  # type: ignore[arg-type]


def test_a_long_unsubscribe_url_stays_literal_on_the_wire():
    assert f"List-Unsubscribe: <{LONG_URL}>\r\n".encode() in to_bytes(message())


@pytest.mark.parametrize("char", LINE_BREAKS, ids=[f"U+{ord(c):04X}" for c in LINE_BREAKS])
@pytest.mark.parametrize("field", ["sender", "recipient", "subject", "headers"])
def test_a_line_break_in_any_header_is_refused_by_the_check_and_by_serialisation(field, char):
    value = f"x@example.test{char}Bcc: y@evil.test"
    bad = message(headers=(("X-Note", value),)) if field == "headers" else message(**{field: value})

    for refuse in (check_message, to_bytes):
        with pytest.raises(RenderError, match="holds a line break") as raised:
            refuse(bad)
        assert "evil" not in str(raised.value)


@pytest.mark.parametrize(
    "bad",
    [
        message(subject="Tea \ud800"),
        message(headers=(("X-Note", "\udfff"),)),
        message(text="picks \ud800"),
        message(html="<p>\udc80</p>"),
    ],
    ids=["subject", "header", "text", "html"],
)
def test_a_lone_surrogate_anywhere_is_refused(bad):
    with pytest.raises(RenderError, match="not valid Unicode"):
        check_message(bad)
    with pytest.raises(RenderError):
        to_bytes(bad)


@pytest.mark.parametrize("name", ["X Note", "X-Note:", "X-Nöte", ""])
def test_a_header_name_that_is_not_a_field_name_is_refused(name):
    with pytest.raises(RenderError, match="header name"):
        to_bytes(message(headers=((name, "v"),)))


def test_non_ascii_headers_and_parts_pass():
    unicode = message(subject="Grüße, €12.50, 中文", text="Grüße\n", html="<p>€</p>")
    check_message(unicode)
    assert b"Subject: =?utf-8?" in to_bytes(unicode)


@pytest.mark.parametrize("sender", CRASHING_SENDERS)
def test_a_parser_crash_is_a_render_error_naming_only_its_type(sender):
    bad = message(sender=sender)
    check_message(bad)  # nothing a cheap check can see: only serialisation finds it

    with pytest.raises(RenderError, match=r"cannot be serialised \(\w+Error\)") as raised:
        to_bytes(bad)
    assert "example.com" not in str(raised.value)


# what header smuggling, bad names and bad text are made of, and what the fast path joins on
_PIECES = [*"aZ9-:; \t\r\n\x85\u2028é€", "\ud800", "\udfff", "x" * 990]
_TEXT = st.lists(st.sampled_from(_PIECES), max_size=3).map("".join)
_NAME = st.lists(st.sampled_from(["X-Note", "X\tNote", "a", "\t", ":", " ", "é"]), max_size=2).map(
    "".join
)


@settings(max_examples=1000)
@given(st.lists(st.tuples(_NAME, _TEXT), max_size=3), st.sampled_from(["Subject", *_PIECES]))
def test_the_one_pass_check_refuses_exactly_what_the_header_by_header_check_refuses(
    headers, subject
):
    m = message(headers=tuple(headers), subject=subject, html=None)
    fields = (("From", m.sender), ("To", m.recipient), ("Subject", m.subject), *m.headers)
    with pytest.raises(RenderError) as by_header:
        mime._name_the_header(m, fields)
    refused_one_by_one = "cannot be sent" not in str(by_header.value)
    if refused_one_by_one:
        with pytest.raises(RenderError) as at_once:
            check_message(m)
        assert str(at_once.value) == str(by_header.value)
    else:
        check_message(m)


#: Python's own SMTP policy at the same line length: what the project's wire policy must match
STOCK = SMTP.clone(max_line_length=mime.MAX_LINE)


def _boundaries_named(wire: bytes) -> bytes:
    for boundary in set(re.findall(rb'boundary="([^"]+)"', wire)):
        wire = wire.replace(boundary, b"BOUNDARY")
    return wire


@pytest.mark.parametrize(
    "m",
    [
        message(),
        message(subject="Grüße, €12.50, 中文 " * 8, text="Grüße\n" * 40, html="<p>€</p>" * 90),
        message(sender="Example Shop <digest@example.com>", recipient="o'brien+x@example.test"),
    ],
    ids=["ascii", "unicode-and-folding", "display-name"],
)
def test_the_cached_header_classes_serialise_the_bytes_pythons_registry_does(m, monkeypatch):
    cached = to_bytes(m)
    monkeypatch.setattr(mime, "WIRE", STOCK)
    assert _boundaries_named(cached) == _boundaries_named(to_bytes(m))


#: what an unstructured header may hold: printable ASCII (spaces at either end or doubled
#: included), encoded-word look-alikes, text beyond ASCII, a line near the limit
HEADER_VALUES = st.one_of(
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40),
    st.sampled_from(
        [
            "=?utf-8?q?caf=C3=A9?=",
            "week =?iso-8859-1?b?4w==?= picks",
            " leading",
            "trailing ",
            "two  spaces",
            "x" * (mime.MAX_LINE - len("Subject: ")),
            "y" * (mime.MAX_LINE - len("Subject: ") + 1),
            "Grüße, €12.50",
        ]
    ),
    st.text(st.characters(exclude_categories=("Cs", "Cc", "Zl", "Zp")), max_size=20),
)


def _serialised(m: Message) -> bytes | str:
    """The wire bytes, or the refusal's text."""
    try:
        return _boundaries_named(to_bytes(m))
    except RenderError as e:
        return str(e)


@settings(max_examples=300, deadline=None)
@given(
    subject=HEADER_VALUES,
    extra=HEADER_VALUES,
    sender=st.sampled_from(["digest@example.com", "Example Shop <digest@example.com>"]),
    recipient=st.one_of(
        st.from_regex(mime.PLAIN_ADDRESS, fullmatch=True),
        st.sampled_from(
            [
                "Ada <ada@example.test>",
                "Zoë <zoe@example.test>",
                '"ada x"@example.test',
                "a=?b?=@example.test",
            ]
        ),
    ),
    # the last one holds the line of the boundary named by the key: the generator draws one
    text=st.sampled_from(["plain", "Grüße\n" * 3, f"a\n--{mime._boundary(message())}\nb"]),
    # a structured header the registry rewrites (GMT becomes +0000): never written as given
    date=st.sampled_from(["Mon, 12 Oct 2026 06:00:00 +0000", "Mon, 12 Oct 2026 06:00:00 GMT"]),
)
def test_the_wire_policy_serialises_the_bytes_smtps_policy_does(
    subject, extra, sender, recipient, text, date
):
    """Values written as given and parsed headers shared between messages change no byte."""
    m = message(
        subject=subject,
        sender=sender,
        recipient=recipient,
        text=text,
        headers=(
            ("X-Digest-Operation-Key", extra),
            ("List-Unsubscribe", f"<{LONG_URL}>"),
            ("Date", date),
        ),
    )
    ours = [_serialised(m), _serialised(m)]  # the second one from the shared headers
    with patch.object(mime, "WIRE", STOCK):
        assert ours == [_serialised(m)] * 2


def test_the_boundary_is_named_by_the_key_unless_a_part_holds_it():
    m = message()
    keyed = mime._boundary(m)
    assert keyed is not None
    assert to_bytes(m) == to_bytes(m)  # nothing drawn at random
    assert f'boundary="{keyed}"'.encode() in to_bytes(m)
    held = message(text=f"a\n--{keyed}\nb")
    assert mime._boundary(held) is None
    wire = to_bytes(held)
    assert f'boundary="{keyed}"'.encode() not in wire
    parts = list(message_from_bytes(wire, policy=default).iter_parts())
    assert [p.get_content().replace("\r\n", "\n") for p in parts] == [
        held.text + "\n",
        f"{held.html}\n",
    ]
