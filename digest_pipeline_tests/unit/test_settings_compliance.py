"""`DIGEST_POSTAL_ADDRESS` and `DIGEST_MESSAGE_ID_DOMAIN` as the settings read them.

Both are optional when read (a demo ledger needs no address; the Message-ID domain defaults to
the sender's); a bad value stops the command at start with one line naming the variable.
"""

from pathlib import Path

import pytest

from digest_pipeline.settings import InvalidSetting, load_settings

ROOT = Path("/srv/shop")


def test_neither_is_set_by_default():
    s = load_settings({}, ROOT)

    assert (s.postal_address, s.message_id_domain) == (None, None)


def test_both_are_read_from_their_variables():
    s = load_settings(
        {
            "DIGEST_POSTAL_ADDRESS": "  Example Shop Ltd, 1 Market Street, Springfield  ",
            "DIGEST_MESSAGE_ID_DOMAIN": "Mail.Shop.Example.",
        },
        ROOT,
    )

    assert s.postal_address == "Example Shop Ltd, 1 Market Street, Springfield"
    assert s.message_id_domain == "mail.shop.example"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DIGEST_POSTAL_ADDRESS", "1 Market Street\nSpringfield"),
        ("DIGEST_POSTAL_ADDRESS", "x" * 5_000),
        ("DIGEST_MESSAGE_ID_DOMAIN", "digest@shop.example"),
        ("DIGEST_MESSAGE_ID_DOMAIN", "shop.example\r\nBcc: x@y.example"),
    ],
)
def test_a_bad_value_is_one_line_naming_its_variable(name, value):
    with pytest.raises(InvalidSetting) as e:
        load_settings({name: value}, ROOT)

    line = str(e.value)
    assert line.startswith(name)
    assert "\n" not in line
    assert len(line) < 300  # a pasted document is not repeated back


def test_a_blank_postal_address_is_unset():
    assert load_settings({"DIGEST_POSTAL_ADDRESS": "   "}, ROOT).postal_address is None
