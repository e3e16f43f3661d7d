"""What mailbox providers read to file and rate a digest: List-Id, Feedback-ID, the preheader.

The list headers are the same for every customer of a week and name no customer; the preheader is
hidden with `display:none`, not by text coloured like its background, which SpamAssassin's
`HTML_FONT_LOW_CONTRAST` scores as hidden text.
"""

import re
from dataclasses import replace
from html.parser import HTMLParser

import pytest

from digest_pipeline.domain.errors import RenderError
from digest_pipeline.domain.model import Message
from digest_pipeline_tests.adapters.test_render import (
    RECIPIENT,
    composer,
    item_for,
    parse,
    picks,
    product,
)

#: RFC 2919 §2: `[phrase] <list-label.list-id-namespace>`, the label a dot-atom-text
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
_LIST_ID = re.compile(rf"(?P<phrase>[^<>]*?)\s*<(?P<id>{_ATEXT}+(?:\.{_ATEXT}+)+)>")
#: the list label the composer names every digest by, the same every week
LIST_LABEL = "weekly-digest"
CUSTOMERS = ("customer-0001", "customer-x_9")


def composed(customer_id: str, sender: str = "digest@example.com", **payload: str) -> Message:
    item = item_for(customer_id)
    rows = picks(item.key, product(1, **payload), product(2))
    return composer(sender=sender).compose(item, f"{customer_id}@mail.example", rows)


def list_headers(message: Message) -> tuple[str, str]:
    parsed = parse(message)
    return str(parsed["List-Id"]), str(parsed["Feedback-ID"])


@pytest.mark.parametrize("customer_id", CUSTOMERS)
def test_a_digest_carries_a_list_id_per_rfc_2919_named_after_the_sender_domain(customer_id):
    list_id, _ = list_headers(composed(customer_id))

    match = _LIST_ID.fullmatch(list_id)
    assert match is not None, list_id
    assert match["phrase"] == "Weekly digest"
    assert match["id"] == f"{LIST_LABEL}.example.com"


def test_a_digest_carries_a_feedback_id_with_the_week_as_campaign_and_the_domain_as_sender():
    _, feedback_id = list_headers(composed("customer-0001"))

    assert feedback_id == "2026-W42:digest:weekly:example.com"
    assert len(feedback_id.split(":")) == 4


def test_another_digest_instance_is_its_own_feedback_id_next_to_the_default():
    item = item_for("customer-0001")
    theirs = replace(item, key=replace(item.key, instance="vip_digest"))
    rows = picks(theirs.key, product(1), product(2))
    _, feedback_id = list_headers(composer().compose(theirs, RECIPIENT, rows))

    assert feedback_id == "2026-W42:vip_digest:weekly:example.com"


def test_the_list_headers_are_the_same_for_two_customers_of_one_week():
    first, second = (list_headers(composed(c, customer_name=c)) for c in CUSTOMERS)

    assert first == second


@pytest.mark.parametrize("customer_id", CUSTOMERS)
def test_the_list_headers_name_no_customer(customer_id):
    message = composed(customer_id)
    headers = dict(message.headers)

    for name in ("List-Id", "Feedback-ID"):
        value = headers[name]
        assert customer_id not in value
        assert message.key.customer_id not in value
        assert message.recipient not in value
        assert message.recipient.partition("@")[0] not in value
        assert RECIPIENT not in value


@pytest.mark.parametrize(
    ("sender", "domain"),
    [
        pytest.param("Example Shop <digest@Shop.Example>", "shop.example", id="display-name"),
        pytest.param("digest@bücher.example", "xn--bcher-kva.example", id="idna"),
    ],
)
def test_the_list_id_namespace_is_the_sender_domain_as_an_ascii_hostname(sender, domain):
    list_id, feedback_id = list_headers(composed("customer-0001", sender=sender))

    assert list_id == f"Weekly digest <{LIST_LABEL}.{domain}>"
    assert feedback_id.endswith(f":{domain}")


def test_a_sender_whose_domain_cannot_name_the_list_makes_every_item_a_render_error():
    subject = composer(sender="digest@[192.0.2.1]")
    for customer_id in CUSTOMERS:
        item = item_for(customer_id)
        with pytest.raises(RenderError, match="List-Id") as raised:
            subject.compose(item, RECIPIENT, picks(item.key, product(1)))
        assert "192.0.2.1" not in str(raised.value)


class _Styles(HTMLParser):
    """Each element's inline style, with the background it is drawn on and the text it holds."""

    def __init__(self) -> None:
        super().__init__()
        #: (tag, style, effective background) of each open element
        self.open: list[tuple[str, dict[str, str], str | None]] = []
        #: (tag, color, own background, effective background) of each element setting a colour
        self.colored: list[tuple[str, str, str | None, str | None]] = []
        self.body_background: str | None = None
        #: text and whether an enclosing element is `display:none`
        self.texts: list[tuple[str, bool]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        style = _style(dict(attrs).get("style") or "")
        own = style.get("background-color") or style.get("background")
        outer = self.open[-1][2] if self.open else None
        if tag == "body":
            self.body_background = own
        if "color" in style:
            self.colored.append((tag, style["color"], own, own or outer))
        if tag not in _VOID:
            self.open.append((tag, style, own or outer))

    def handle_endtag(self, tag: str) -> None:
        while self.open:
            if self.open.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        hidden = any(s.get("display") == "none" for _, s, _ in self.open)
        if data.strip():
            self.texts.append((data.strip(), hidden))


_VOID = frozenset({"meta", "img", "br", "hr", "input", "link", "area", "base", "col", "wbr"})


def _style(text: str) -> dict[str, str]:
    pairs = (p.partition(":") for p in text.split(";") if ":" in p)
    return {name.strip().lower(): value.strip().lower() for name, _, value in pairs}


def _rgb(color: str) -> tuple[int, int, int] | None:
    match = re.fullmatch(r"#([0-9a-f]{3}|[0-9a-f]{6})", color.strip().lower())
    if match is None:
        return None
    digits = match[1] if len(match[1]) == 6 else "".join(c * 2 for c in match[1])
    r, g, b = (int(digits[i : i + 2], 16) for i in (0, 2, 4))
    return r, g, b


def _contrast(a: str, b: str) -> float:
    """WCAG 2 contrast ratio of two hex colours (1 for the same colour, 21 for black on white)."""
    rgb_a, rgb_b = _rgb(a), _rgb(b)
    assert rgb_a is not None, a
    assert rgb_b is not None, b

    def luminance(rgb: tuple[int, int, int]) -> float:
        c = [v / 255 for v in rgb]
        lin = [x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4 for x in c]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    hi, lo = sorted((luminance(rgb_a), luminance(rgb_b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def styles(html: str) -> _Styles:
    parser = _Styles()
    parser.feed(html)
    parser.close()
    return parser


def test_the_contrast_helper_sees_text_coloured_like_its_background():
    # the hidden-text trick the check exists to catch: a preheader coloured like its background
    html = '<body style="background-color:#f4f4f5"><span style="color:#F4F4F5">x</span></body>'
    [(_, color, _, _)] = styles(html).colored
    assert _contrast(color, "#f4f4f5") == pytest.approx(1)


def test_the_preheader_is_in_the_html_inside_an_element_styled_display_none():
    message = composed("customer-0001")
    preheader = "2 picks chosen for you this week: Walnut chopping board 1, Walnut chopping board 2"

    texts = styles(message.html or "").texts

    assert (preheader, True) in texts
    # the greeting is what a reader sees: only the preheader is hidden
    assert ("Hi there,", False) in texts


@pytest.mark.parametrize("customer_id", CUSTOMERS)
def test_no_text_is_coloured_like_its_background(customer_id):
    # WCAG's 3:1 for large text is far above what SpamAssassin calls low contrast
    parsed = styles(composed(customer_id, customer_name="Ada").html or "")

    assert parsed.body_background is not None
    assert parsed.colored
    for tag, color, own, drawn_on in parsed.colored:
        assert color not in (own, parsed.body_background), (tag, color)
        assert drawn_on is not None, tag
        assert _contrast(color, drawn_on) >= 3, (tag, color, drawn_on)
