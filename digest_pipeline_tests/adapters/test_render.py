"""The Jinja2 composer: both parts, the headers every digest carries, escaping and refusals."""

import email
import email.policy
from email.message import EmailMessage
from typing import Any

import pytest

from digest_pipeline.adapters.mail.mime import to_bytes
from digest_pipeline.adapters.mail.render import Jinja2Composer, message_id_key, unsubscribe_token
from digest_pipeline.domain.errors import RenderError
from digest_pipeline.domain.model import DigestRow, Message, WorkItem, keyed_message_id
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline_tests.builders import SHOP_POSTAL_ADDRESS
from digest_pipeline_tests.conftest import T0, W42
from digest_pipeline_tests.fakes import FixedClock

RECIPIENT = "ada@example.com"
UNSUBSCRIBE = "https://shop.example/unsubscribe/{customer_id}?token={token}"
EXPECTED_HEADERS = {
    "From",
    "To",
    "Subject",
    "Message-ID",
    "X-Digest-Operation-Key",
    "List-Unsubscribe",
    "List-Unsubscribe-Post",
    "List-Id",
    "Feedback-ID",
    "Date",
    "MIME-Version",
    "Content-Type",
}
INJECTION = "\r\nBcc: x@evil.example"


def item_for(customer_id: str = "customer-0001") -> WorkItem:
    return WorkItem(
        key=OperationKey(W42, customer_id),
        state=DeliveryState.CLAIMED,
        created_at=T0,
        next_attempt_at=None,
    )


def picks(key: OperationKey, *payloads: dict[str, Any]) -> list[DigestRow]:
    return [DigestRow(key, n, payload) for n, payload in enumerate(payloads)]


def product(n: int, **overrides: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "title": f"Walnut chopping board {n}",
        "price": f"{n}2.50",
        "url": f"https://shop.example/p/{n}",
        "image_url": f"https://cdn.shop.example/p/{n}.jpg",
    }
    return payload | overrides


def composer(secret: str = "s3cret", sender: str = "digest@example.com") -> Jinja2Composer:
    return Jinja2Composer(
        sender=sender,
        unsubscribe_url=UNSUBSCRIBE,
        unsubscribe_secret=secret,
        clock=FixedClock(T0),
        postal_address=SHOP_POSTAL_ADDRESS,
    )


def compose(*payloads: dict[str, Any], item: WorkItem | None = None, **kw: Any) -> Message:
    item = item or item_for()
    return composer(**kw).compose(item, RECIPIENT, picks(item.key, *payloads))


def parse(message: Message) -> EmailMessage:
    parsed = email.message_from_bytes(to_bytes(message), policy=email.policy.default)
    assert isinstance(parsed, EmailMessage)
    return parsed


def parts(parsed: EmailMessage) -> tuple[str, str]:
    plain, html = parsed.iter_parts()
    assert plain.get_content_type() == "text/plain"
    assert html.get_content_type() == "text/html"
    return str(plain.get_content()), str(html.get_content())


def unsubscribe_url(message: Message) -> str:
    return dict(message.headers)["List-Unsubscribe"].strip("<>")


def test_the_message_is_multipart_alternative_with_every_digest_header() -> None:
    item = item_for()
    parsed = parse(compose(product(1), product(2), item=item))

    assert parsed.get_content_type() == "multipart/alternative"
    assert [p.get_content_type() for p in parsed.iter_parts()] == ["text/plain", "text/html"]
    assert set(parsed.keys()) == EXPECTED_HEADERS
    assert parsed["Message-ID"] == keyed_message_id(
        item.key, message_id_key("s3cret"), "example.com"
    )
    assert parsed["X-Digest-Operation-Key"] == "digest:2026-W42:customer-0001"
    assert parsed["To"] == RECIPIENT
    assert parsed["From"] == "digest@example.com"
    token = unsubscribe_token("s3cret", "customer-0001")
    assert parsed["List-Unsubscribe"] == (
        f"<https://shop.example/unsubscribe/customer-0001?token={token}>"
    )
    assert parsed["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert parsed["Date"].datetime == T0
    assert "week 42, 2026" in parsed["Subject"]


def test_message_id_is_stable_per_key_and_differs_between_keys() -> None:
    first, again = compose(product(1)), compose(product(2))
    other = compose(product(1), item=item_for("customer-0002"))

    assert parse(first)["Message-ID"] == parse(again)["Message-ID"]
    assert parse(first)["Message-ID"] != parse(other)["Message-ID"]


def test_every_pick_appears_in_both_parts_and_the_preheader_in_the_html() -> None:
    rows = [product(1), product(2, currency="USD"), product(3, currency="CHF")]
    message = compose(*rows)
    plain, html = parts(parse(message))

    for row, price in zip(rows, ["€12.50", "$22.50", "32.50 CHF"], strict=True):
        for part in (plain, html):
            assert row["title"] in part
            assert price in part
            assert row["url"] in part
        assert f'src="{row["image_url"]}"' in html
        assert f'alt="{row["title"]}"' in html
    assert "3 picks chosen for you this week: Walnut chopping board 1" in html
    assert "display:none" in html
    assert unsubscribe_url(message) in plain
    assert unsubscribe_url(message).replace("&", "&amp;") in html


def test_html_is_escaped_and_text_is_not() -> None:
    message = compose(product(1, title="<script>alert(1)</script> Salt & Pepper"))
    plain, html = parts(parse(message))

    assert "&lt;script&gt;alert(1)&lt;/script&gt; Salt &amp; Pepper" in html
    assert "<script" not in html.lower()
    assert "<script>alert(1)</script> Salt & Pepper" in plain
    assert "&lt;" not in plain
    assert "&amp;" not in plain
    assert "Salt & Pepper" in message.subject


@pytest.mark.parametrize("field", ["title", "customer_name"])
def test_header_injection_in_content_comes_out_inert(field: str) -> None:
    message = compose(product(1, **{field: f"Tea{INJECTION}"}), product(2))
    parsed = parse(message)

    assert set(parsed.keys()) == EXPECTED_HEADERS
    assert "Bcc" not in parsed
    assert "\r" not in message.subject
    assert "\n" not in message.subject
    assert "Tea Bcc: x@evil.example" in parsed["Subject"]


def test_customer_name_greets_and_long_subjects_are_cut() -> None:
    message = compose(product(1, customer_name="Ada", title="x" * 300))
    plain, html = parts(parse(message))

    assert plain.startswith("Hi Ada,")
    assert "Hi Ada," in html
    assert message.subject.startswith("Ada, your Example Shop picks")
    assert len(message.subject) <= 150


def test_unsubscribe_url_is_per_customer_and_keyed_by_the_secret() -> None:
    one = unsubscribe_url(compose(product(1)))
    again = unsubscribe_url(compose(product(2)))
    other = unsubscribe_url(compose(product(1), item=item_for("customer-0002")))
    rekeyed = unsubscribe_url(compose(product(1), secret="another secret"))

    assert one == again
    assert "/customer-0001?" in one
    assert one != other
    assert one != rekeyed
    assert len(unsubscribe_token("s3cret", "customer-0001")) == 32
    assert unsubscribe_token("s3cret", "customer-0001") != unsubscribe_token("x", "customer-0001")


def assert_refused(raised: pytest.ExceptionInfo[RenderError], *secrets: str) -> None:
    text = str(raised.value)
    assert text.startswith("digest:2026-W42:customer-0001: ")
    assert "\n" not in text
    assert "\r" not in text
    for secret in secrets:
        assert secret not in text


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param({k: v for k, v in product(1).items() if k != "title"}, id="missing-title"),
        pytest.param({k: v for k, v in product(1).items() if k != "url"}, id="missing-url"),
        pytest.param(product(1, url="javascript:alert(1)"), id="script-url"),
        pytest.param(product(1, price="twelve"), id="bad-price"),
    ],
)
def test_a_bad_row_is_a_render_error(payload: dict[str, Any]) -> None:
    with pytest.raises(RenderError) as raised:
        compose(product(2), payload)
    assert_refused(raised, "Walnut", "shop.example")


def test_no_rows_is_a_render_error() -> None:
    item = item_for()
    with pytest.raises(RenderError, match="no digest rows") as raised:
        composer().compose(item, RECIPIENT, [])
    assert_refused(raised, RECIPIENT)


@pytest.mark.parametrize(
    "recipient",
    [
        "not-an-address",
        "a@b@c",
        "x@example.com\r\nBcc: y@evil.example",
        '"Evil" <x@example.com>',
        "x@example.com, y@example.com",
        "",
        "x@[",  # the email package's parser crashes on it with AttributeError
        "x" + "(" * 2000 + "@example.com",  # ... and on this with RecursionError
    ],
)
def test_an_invalid_recipient_is_a_render_error(recipient: str) -> None:
    item = item_for()
    with pytest.raises(RenderError) as raised:
        composer().compose(item, recipient, picks(item.key, product(1)))
    assert_refused(raised, *(recipient.split() if recipient else []), "example.com")


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(product(1, title="Tea \ud800"), id="title"),
        pytest.param(product(1, customer_name="Ada \udfff"), id="customer-name"),
        pytest.param(product(1, url="https://shop.example/p/\ud800"), id="url"),
    ],
)
def test_text_utf8_cannot_encode_is_a_render_error(payload: dict[str, Any]) -> None:
    with pytest.raises(RenderError, match="not valid Unicode") as raised:
        compose(payload)
    assert_refused(raised, "Tea", "Ada", "shop.example")


@pytest.mark.parametrize(
    "sender",
    ["^@", "x@[", "digest@example.com\r\nBcc: x@evil.example", "digest@example.com\u2028"],
)
def test_a_sender_the_email_package_refuses_makes_every_item_a_render_error(sender: str) -> None:
    subject = composer(sender=sender)  # a setting: refused per item, as every item would be
    for customer_id in ("customer-0001", "customer-0002"):
        item = item_for(customer_id)
        with pytest.raises(RenderError, match="sender or the unsubscribe link") as raised:
            subject.compose(item, RECIPIENT, picks(item.key, product(1)))
        assert "evil" not in str(raised.value)
        assert "example.com" not in str(raised.value)


def test_every_composed_message_serialises() -> None:
    # compose no longer serialises; what it returns must still be what the mailers can send
    names = ["Ada", "Zoë", "<b>Bob</b>", "x" * 300, "Tea\r\nBcc: x@evil.example", "中文 名字"]
    for n, name in enumerate(names):
        item = item_for(f"customer-{n:04d}")
        rows = picks(item.key, product(1, customer_name=name, title=name), product(2))
        to_bytes(composer().compose(item, f"c{n}+tag@example.com", rows))


def test_a_missing_template_variable_is_a_render_error() -> None:
    subject = composer()
    # a template that names a variable the composer does not pass, as a typo in a template would
    env = subject._templates["digest.txt.j2"].environment
    subject._templates["digest.txt.j2"] = env.from_string("{{ customer.first_name }}")
    item = item_for()
    with pytest.raises(RenderError, match="UndefinedError") as raised:
        subject.compose(item, RECIPIENT, picks(item.key, product(1)))
    assert_refused(raised, RECIPIENT, "Walnut")
