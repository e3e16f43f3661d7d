"""Every digest's footer shows the sender's postal address (CAN-SPAM), in both parts.

The HTML part escapes it like any other text; a composer without one (only a demo ledger may
start so) shows a marked placeholder instead of leaving the line out.
"""

from typing import Any

import pytest

from digest_pipeline.adapters.mail.render import DEMO_POSTAL_ADDRESS, Jinja2Composer
from digest_pipeline.domain.errors import RenderError
from digest_pipeline_tests.adapters.test_render import (
    RECIPIENT,
    UNSUBSCRIBE,
    item_for,
    parse,
    parts,
    picks,
    product,
)
from digest_pipeline_tests.conftest import T0
from digest_pipeline_tests.fakes import FixedClock

ADDRESS = "Example Shop Ltd, 1 Market Street, Springfield 12345"


def composed_parts(postal_address: str | None, **kw: Any) -> tuple[str, str]:
    composer = Jinja2Composer(
        sender="digest@shop.example",
        unsubscribe_url=UNSUBSCRIBE,
        unsubscribe_secret="s3cret",
        clock=FixedClock(T0),
        postal_address=postal_address,
        **kw,
    )
    item = item_for()
    return parts(parse(composer.compose(item, RECIPIENT, picks(item.key, product(1)))))


def test_the_postal_address_is_in_the_footer_of_both_parts():
    text, html = composed_parts(ADDRESS)

    footer = text.rpartition("\n--\n")[2]
    assert ADDRESS in footer
    assert ADDRESS in html.rpartition("Unsubscribe with one click")[2]


def test_the_html_part_escapes_the_postal_address_and_the_text_part_keeps_it():
    address = 'Bob & Sons <b>"Ltd"</b>, 1 Market Street'

    text, html = composed_parts(address)

    assert address in text
    assert "Bob &amp; Sons &lt;b&gt;&#34;Ltd&#34;&lt;/b&gt;, 1 Market Street" in html
    assert "<b>" not in html


def test_without_a_postal_address_both_parts_show_the_demo_placeholder():
    text, html = composed_parts(None)

    assert DEMO_POSTAL_ADDRESS in text
    assert DEMO_POSTAL_ADDRESS in html


@pytest.mark.parametrize("address", ["1 Market Street\nBcc: x@evil.example", "x" * 201])
def test_a_postal_address_the_setting_would_refuse_makes_every_item_a_render_error(address):
    with pytest.raises(RenderError, match="the postal address"):
        composed_parts(address)
