"""The digest's Message-ID: keyed by the install's secret, at the install's domain, stable per key.

The domain is the sender's, or `DIGEST_MESSAGE_ID_DOMAIN` where it is set.

A Message-ID any install would give, or one computed from a customer id, lets anyone name (and
so forge or correlate) another install's digests; one that changes between retries of a key
hides a duplicate from the receiver.
"""

import hashlib
import re
from pathlib import Path

import pytest

from digest_pipeline.adapters.mail.render import Jinja2Composer, message_id_key
from digest_pipeline.domain.errors import RenderError
from digest_pipeline.domain.model import keyed_message_id, message_id_for
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.settings import load_settings
from digest_pipeline.wiring import build_composer
from digest_pipeline_tests.adapters.test_render import (
    RECIPIENT,
    UNSUBSCRIBE,
    composer,
    item_for,
    parse,
    picks,
    product,
)
from digest_pipeline_tests.conftest import T0, W42
from digest_pipeline_tests.fakes import FixedClock

CUSTOMER = "customer-0001"


def message_id(secret: str = "s3cret", sender: str = "digest@example.com") -> str:
    item = item_for(CUSTOMER)
    rows = picks(item.key, product(1), product(2))
    message = composer(secret=secret, sender=sender).compose(item, RECIPIENT, rows)
    return str(parse(message)["Message-ID"])


def test_two_installs_give_one_key_different_message_ids():
    assert message_id(secret="install-one-secret") != message_id(secret="install-two-secret")


def test_one_install_gives_every_compose_of_one_key_the_same_message_id():
    assert message_id() == message_id()


def test_the_message_id_shows_neither_the_customer_id_nor_the_keys_plain_digest():
    key = item_for(CUSTOMER).key
    shown = message_id()

    assert CUSTOMER not in shown
    assert hashlib.sha256(str(key).encode()).hexdigest()[:32] not in shown
    assert shown != message_id_for(key)


def test_the_message_id_is_32_hex_digits_at_the_sender_domain():
    assert re.fullmatch(r"<[0-9a-f]{32}@example\.com>", message_id())
    assert message_id(sender="Shop <news@shop.example>").endswith("@shop.example>")


def test_the_message_id_is_keyed_by_a_key_derived_from_the_secret_not_the_secret_itself():
    key = item_for(CUSTOMER).key
    derived = message_id_key("s3cret")

    assert message_id() == keyed_message_id(key, derived, "example.com")
    assert message_id() != keyed_message_id(key, b"s3cret", "example.com")


def test_a_keyed_message_id_differs_per_operation_key():
    id_key = message_id_key("s3cret")
    one = keyed_message_id(OperationKey(W42, "customer-1"), id_key, "shop.example")

    assert one != keyed_message_id(OperationKey(W42, "customer-2"), id_key, "shop.example")


def _with_message_id_domain(domain: str) -> Jinja2Composer:
    """The shop's composer, its Message-IDs at `domain`."""
    return Jinja2Composer(
        sender="digest@shop.example",
        unsubscribe_url=UNSUBSCRIBE,
        unsubscribe_secret="s3cret",
        clock=FixedClock(T0),
        message_id_domain=domain,
    )


def test_the_message_id_domain_setting_replaces_the_senders_domain_there_only():
    item = item_for(CUSTOMER)
    rows = picks(item.key, product(1), product(2))
    mail = _with_message_id_domain("mail.shop.example")

    parsed = parse(mail.compose(item, RECIPIENT, rows))

    assert parsed["Message-ID"] == keyed_message_id(
        item.key, message_id_key("s3cret"), "mail.shop.example"
    )
    # the list stays named after the sender's domain
    assert parsed["List-Id"] == "Weekly digest <weekly-digest.shop.example>"


def test_the_composer_the_settings_build_uses_the_message_id_domain():
    env = {
        "DIGEST_FROM_ADDRESS": "digest@shop.example",
        "DIGEST_MESSAGE_ID_DOMAIN": "m.shop.example",
    }
    built = build_composer(load_settings(env, Path("/srv/shop")), FixedClock(T0))
    item = item_for(CUSTOMER)

    message = built.compose(item, RECIPIENT, picks(item.key, product(1)))

    assert str(parse(message)["Message-ID"]).endswith("@m.shop.example>")


def test_a_composer_given_a_message_id_domain_that_is_no_hostname_renders_nothing():
    item = item_for(CUSTOMER)
    mail = _with_message_id_domain("shop.example>\r\nBcc: x@evil.example")

    with pytest.raises(RenderError, match="the Message-ID domain"):
        mail.compose(item, RECIPIENT, picks(item.key, product(1)))
