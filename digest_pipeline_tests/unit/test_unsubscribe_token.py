"""The one-click token and the public-secret rule of `domain/unsubscribe.py`."""

import hashlib
import hmac

import pytest
from hypothesis import given
from hypothesis import strategies as st

from digest_pipeline.adapters.mail.render import unsubscribe_token as rendered_token
from digest_pipeline.domain.unsubscribe import (
    DEMO_UNSUBSCRIBE_SECRET,
    public_secret_refusal,
    token_matches,
    token_signer,
    unsubscribe_token,
)

SECRET = "a-private-secret-for-tests"


def test_the_composer_signs_with_the_token_serve_checks():
    assert rendered_token is unsubscribe_token
    assert token_matches(SECRET, "customer-0001", unsubscribe_token(SECRET, "customer-0001"))


@given(
    st.text(min_size=1, max_size=40),
    st.lists(st.from_regex(r"[A-Za-z0-9._-]{1,24}", fullmatch=True)),
)
def test_one_keyed_signer_gives_each_customer_the_plain_hmac(secret, customer_ids):
    sign = token_signer(secret)
    for customer_id in [*customer_ids, *customer_ids]:  # each twice: a token leaves no state
        plain = hmac.new(secret.encode(), customer_id.encode(), hashlib.sha256).hexdigest()
        assert sign(customer_id) == plain[:32]


def test_a_token_is_one_customers_under_one_secret():
    token = unsubscribe_token(SECRET, "customer-0001")
    assert not token_matches(SECRET, "customer-0002", token)  # cross-customer
    assert not token_matches("another-secret", "customer-0001", token)  # another secret
    assert not token_matches(SECRET, "customer-0001", token[:-1])  # cut short
    assert not token_matches(SECRET, "customer-0001", token.upper())  # hex is case-sensitive


@given(st.text(max_size=80))
def test_any_text_is_a_wrong_token_not_an_error(token):
    # lone surrogates, non-ASCII, empty: compared, refused, never raised
    assert token_matches(SECRET, "customer-0001", token) is (
        token == unsubscribe_token(SECRET, "customer-0001")
    )


@pytest.mark.parametrize(
    ("secret", "demo", "refused"),
    [
        (DEMO_UNSUBSCRIBE_SECRET, False, True),  # the public value on a real shop's ledger
        (DEMO_UNSUBSCRIBE_SECRET, True, False),  # the public value on `digest seed` data
        (SECRET, False, False),  # a private value anywhere
        (SECRET, True, False),
    ],
)
def test_the_public_secret_is_refused_outside_the_demo_only(secret: str, demo: bool, refused: bool):
    asked: list[bool] = []

    def holds_demo_data() -> bool:
        asked.append(demo)
        return demo

    refusal = public_secret_refusal(secret, holds_demo_data, what="digest serve")
    # the ledger is read only for the public secret: a private one needs no look
    assert bool(asked) is (secret == DEMO_UNSUBSCRIBE_SECRET)
    assert (refusal is not None) is refused
    if refusal is not None:
        assert refusal.startswith("digest serve refused: DIGEST_UNSUBSCRIBE_SECRET")
        assert "\n" not in refusal
        assert DEMO_UNSUBSCRIBE_SECRET not in refusal
