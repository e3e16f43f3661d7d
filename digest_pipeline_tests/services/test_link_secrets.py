"""Which unsubscribe secret a process may use on a ledger, and its audited rotation.

The first process that signs or checks links records its secret's fingerprint; any other secret
is then refused in one line naming `DIGEST_UNSUBSCRIBE_SECRET`, until `rotate_secret` records a
new one. During the rotation's overlap `digest serve` needs the rotated-out secret too, and
accepts links it signed only until the overlap ends.
"""

from datetime import timedelta

import pytest

from digest_pipeline.domain.compliance import Compliance
from digest_pipeline.domain.fingerprints import ROTATE_ACTION, UNSUBSCRIBE, fingerprint
from digest_pipeline.domain.unsubscribe import unsubscribe_token
from digest_pipeline.services.link_secrets import (
    Rotation,
    SecretRefused,
    require_secret,
    rotate_secret,
    secret_refusal,
    serve_secrets,
    start_refusal,
)
from digest_pipeline_tests.builders import SHOP_POSTAL_ADDRESS, SHOP_UNSUBSCRIBE_URL
from digest_pipeline_tests.fakes import FakeLedger, FixedClock

OLD, NEW, OTHER = "an-old-secret-of-some-length", "a-new-secret-of-some-length", "x" * 20
EIGHT_WEEKS = timedelta(weeks=8)
#: what a real shop's digests carry: a public https link and a postal address
SHOP = Compliance(SHOP_UNSUBSCRIBE_URL, SHOP_POSTAL_ADDRESS)


@pytest.fixture
def shop() -> FakeLedger:
    ledger = FakeLedger()
    ledger.demo_data = False
    return ledger


def _rotate(
    ledger: FakeLedger,
    clock: FixedClock,
    new: str = NEW,
    previous: str | None = OLD,
    overlap: timedelta = EIGHT_WEEKS,
    reason: str = "scheduled",
) -> Rotation:
    return rotate_secret(ledger, new, previous, overlap, clock.now(), actor="alice", reason=reason)


def _refused(call) -> str:
    with pytest.raises(SecretRefused) as e:
        call()
    line = str(e.value)
    assert "\n" not in line
    assert OLD not in line
    assert NEW not in line
    assert OTHER not in line
    return line


def test_the_first_process_records_its_secret_and_another_secret_is_refused(shop, clock):
    assert secret_refusal(shop, OLD, clock.now(), what="digest run") is None
    record = shop.secret_fingerprints.fingerprint_record(UNSUBSCRIBE)
    assert record is not None
    assert record.current == fingerprint(OLD)

    refusal = secret_refusal(shop, OTHER, clock.now(), what="delivery")

    assert refusal is not None
    assert refusal.startswith("delivery refused: DIGEST_UNSUBSCRIBE_SECRET is not the secret")
    assert shop.secret_fingerprints.fingerprint_record(UNSUBSCRIBE) == record
    assert secret_refusal(shop, OLD, clock.now(), what="digest serve") is None


def test_a_short_or_public_secret_is_refused_before_anything_is_recorded(shop, clock):
    line = _refused(lambda: require_secret(shop, "short", clock.now(), what="digest sweep"))
    assert line.startswith("digest sweep refused: DIGEST_UNSUBSCRIBE_SECRET is 5 bytes")
    assert shop.secret_fingerprints.fingerprint_record(UNSUBSCRIBE) is None


def test_a_rotation_moves_the_ledger_to_the_new_secret_with_an_audit_row(shop, clock):
    require_secret(shop, OLD, clock.now(), what="digest run")

    rotation = _rotate(shop, clock)

    assert isinstance(rotation, Rotation)
    after = shop.secret_fingerprints.fingerprint_record(UNSUBSCRIBE)
    assert after == rotation.after
    assert (after.current, after.previous) == (fingerprint(NEW), fingerprint(OLD))
    assert after.previous_until == clock.now() + EIGHT_WEEKS
    (row,) = shop.audit_log()
    assert (row.action, row.actor) == (ROTATE_ACTION, "alice")
    assert row.reason.startswith("scheduled [")
    assert secret_refusal(shop, NEW, clock.now(), what="digest run") is None
    old = secret_refusal(shop, OLD, clock.now(), what="digest run")
    assert old is not None
    assert "DIGEST_UNSUBSCRIBE_SECRET is the secret rotated out" in old


@pytest.mark.parametrize(
    ("new", "previous", "overlap", "reason", "says"),
    [
        (NEW, None, EIGHT_WEEKS, "x", "set DIGEST_UNSUBSCRIBE_SECRET_PREVIOUS"),
        (NEW, OTHER, EIGHT_WEEKS, "x", "DIGEST_UNSUBSCRIBE_SECRET_PREVIOUS is not the secret"),
        (OLD, OLD, EIGHT_WEEKS, "x", "is the same as"),
        (OLD, None, timedelta(0), "x", "already the recorded secret"),
        ("short", OLD, EIGHT_WEEKS, "x", "at least 16 bytes"),
        (NEW, OLD, EIGHT_WEEKS, "  ", "--reason"),
    ],
)
def test_a_refused_rotation_writes_nothing(shop, clock, new, previous, overlap, reason, says):
    require_secret(shop, OLD, clock.now(), what="digest run")
    before = shop.secret_fingerprints.fingerprint_record(UNSUBSCRIBE)

    line = _refused(lambda: _rotate(shop, clock, new, previous, overlap, reason))

    assert line.startswith("digest rotate-secret refused: ")
    assert says in line
    assert shop.secret_fingerprints.fingerprint_record(UNSUBSCRIBE) == before
    assert shop.audit_log() == []


def test_a_rotation_without_overlap_needs_no_previous_secret_and_keeps_none(shop, clock):
    require_secret(shop, OLD, clock.now(), what="digest run")

    rotation = _rotate(shop, clock, previous=None, overlap=timedelta(0), reason="leaked")

    assert (rotation.after.previous, rotation.after.previous_until) == (None, None)
    assert serve_secrets(shop, NEW, None, clock.now(), compliance=SHOP).previous is None


def test_serve_needs_the_rotated_out_secret_during_the_overlap_and_only_then(shop, clock):
    require_secret(shop, OLD, clock.now(), what="digest run")
    _rotate(shop, clock)

    missing = _refused(lambda: serve_secrets(shop, NEW, None, clock.now(), compliance=SHOP))
    assert "set DIGEST_UNSUBSCRIBE_SECRET_PREVIOUS" in missing
    wrong = _refused(lambda: serve_secrets(shop, NEW, OTHER, clock.now(), compliance=SHOP))
    assert "DIGEST_UNSUBSCRIBE_SECRET_PREVIOUS is not the secret this ledger rotated out" in wrong

    secrets = serve_secrets(shop, NEW, OLD, clock.now(), compliance=SHOP)
    old_link = unsubscribe_token(OLD, "customer-0001")
    assert secrets.secret_of("customer-0001", old_link, clock.now()) == OLD

    clock.advance(EIGHT_WEEKS)
    assert serve_secrets(shop, NEW, None, clock.now(), compliance=SHOP).previous is None
    assert secrets.secret_of("customer-0001", old_link, clock.now()) is None


def test_a_second_rotation_ends_the_first_ones_overlap(shop, clock):
    require_secret(shop, OLD, clock.now(), what="digest run")
    _rotate(shop, clock)
    clock.advance(timedelta(days=1))

    _rotate(shop, clock, new=OTHER, previous=NEW)

    record = shop.secret_fingerprints.fingerprint_record(UNSUBSCRIBE)
    assert record is not None
    assert record.previous == fingerprint(NEW)
    wrong = _refused(lambda: serve_secrets(shop, OTHER, OLD, clock.now(), compliance=SHOP))
    assert "DIGEST_UNSUBSCRIBE_SECRET_PREVIOUS" in wrong


LOOPBACK = Compliance("http://127.0.0.1:8025/unsubscribe/{customer_id}?token={token}", None)


@pytest.mark.parametrize(
    ("compliance", "variable"),
    [
        (LOOPBACK, "DIGEST_UNSUBSCRIBE_URL"),
        (Compliance(SHOP_UNSUBSCRIBE_URL, None), "DIGEST_POSTAL_ADDRESS"),
    ],
)
def test_a_start_without_a_public_link_or_an_address_records_nothing(
    shop, clock, compliance, variable
):
    line = start_refusal(shop, OLD, compliance, clock.now(), what="digest run")

    assert line is not None
    assert line.startswith(f"digest run refused: {variable} ")
    assert "\n" not in line
    assert shop.secret_fingerprints.fingerprint_record(UNSUBSCRIBE) is None


def test_serve_refuses_to_start_with_a_loopback_link(shop, clock):
    line = _refused(lambda: serve_secrets(shop, OLD, None, clock.now(), compliance=LOOPBACK))

    assert line.startswith("digest serve refused: DIGEST_UNSUBSCRIBE_URL must start with https://")
    assert shop.secret_fingerprints.fingerprint_record(UNSUBSCRIBE) is None


def test_a_demo_ledger_starts_with_the_loopback_link_and_no_address(clock):
    demo = FakeLedger()
    demo.demo_data = True

    assert start_refusal(demo, OLD, LOOPBACK, clock.now(), what="digest run") is None


def test_a_compliant_start_records_the_secret(shop, clock):
    assert start_refusal(shop, OLD, SHOP, clock.now(), what="digest run") is None
    record = shop.secret_fingerprints.fingerprint_record(UNSUBSCRIBE)
    assert record is not None
    assert record.current == fingerprint(OLD)


def test_a_weak_secret_is_named_before_the_link(shop, clock):
    line = start_refusal(shop, "short", LOOPBACK, clock.now(), what="digest run")

    assert line is not None
    assert "DIGEST_UNSUBSCRIBE_SECRET is 5 bytes" in line
