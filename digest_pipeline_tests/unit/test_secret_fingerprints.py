"""The keyed fingerprint of a secret, the minimum secret length, and the secrets a link may carry."""

import hashlib
import hmac
from datetime import timedelta

import pytest

from digest_pipeline.domain.fingerprints import FINGERPRINT_LENGTH, fingerprint
from digest_pipeline.domain.unsubscribe import (
    MIN_SECRET_BYTES,
    LinkSecrets,
    short_secret_refusal,
    unsubscribe_token,
)
from digest_pipeline_tests.conftest import T0

OLD, NEW = "an-old-secret-of-some-length", "a-new-secret-of-some-length"


def test_the_fingerprint_is_the_documented_hmac_and_never_holds_the_secret():
    label = b"digest-unsubscribe-fingerprint"
    expected = hmac.new(OLD.encode(), label, hashlib.sha512).hexdigest()[:FINGERPRINT_LENGTH]
    assert fingerprint(OLD) == expected
    assert len(fingerprint(OLD)) == FINGERPRINT_LENGTH
    assert OLD not in fingerprint(OLD)
    assert fingerprint(OLD) != fingerprint(NEW)
    # keyed, so no plain hash of a guess; and never the token of a customer named as the label
    assert fingerprint(OLD) != hashlib.sha256(OLD.encode()).hexdigest()
    assert not fingerprint(OLD).startswith(unsubscribe_token(OLD, label.decode()))


@pytest.mark.parametrize(
    ("secret", "demo", "refused"),
    [
        ("x" * (MIN_SECRET_BYTES - 1), False, True),  # one byte short, on a real shop's ledger
        ("x" * MIN_SECRET_BYTES, False, False),  # exactly the minimum
        ("é" * (MIN_SECRET_BYTES // 2), False, False),  # counted in bytes, not characters
        ("x", True, False),  # the demo ledger may use anything
    ],
)
def test_a_secret_under_the_minimum_is_refused_outside_the_demo(secret, demo, refused):
    refusal = short_secret_refusal(secret, lambda: demo, what="digest run")
    assert (refusal is not None) is refused
    if refusal is not None:
        assert refusal.startswith("digest run refused: DIGEST_UNSUBSCRIBE_SECRET is ")
        assert "\n" not in refusal
        assert secret not in refusal


def test_a_link_of_the_previous_secret_is_accepted_only_until_the_overlap_ends():
    until = T0 + timedelta(weeks=8)
    secrets = LinkSecrets(NEW, OLD, until)
    old_link, new_link = unsubscribe_token(OLD, "c-1"), unsubscribe_token(NEW, "c-1")

    assert secrets.secret_of("c-1", new_link, until + timedelta(days=400)) == NEW
    assert secrets.secret_of("c-1", old_link, until - timedelta(seconds=1)) == OLD
    assert secrets.secret_of("c-1", old_link, until) is None
    assert secrets.secret_of("c-2", old_link, T0) is None  # another customer's token
    # a previous secret without a recorded overlap is never accepted
    assert LinkSecrets(NEW, OLD).secret_of("c-1", old_link, T0) is None
    assert OLD not in repr(secrets)
    assert NEW not in repr(secrets)
