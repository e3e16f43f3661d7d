"""`digest serve`'s settings: webhook secrets, the replay window, the default link, the limits."""

import base64
from datetime import timedelta
from pathlib import Path

import pytest

from digest_pipeline.domain.unsubscribe import DEMO_UNSUBSCRIBE_SECRET
from digest_pipeline.settings import InvalidSetting, ServeLimits, load_settings

ROOT = Path("/srv/shop")
KEY_A, KEY_B = b"a" * 24, b"b" * 32
WHSEC_A = "whsec_" + base64.b64encode(KEY_A).decode()
WHSEC_B = "whsec_" + base64.b64encode(KEY_B).decode()


def test_by_default_no_provider_is_trusted_and_the_link_points_at_digest_serve():
    s = load_settings({}, ROOT)
    assert s.webhook_keys() == {}
    assert s.webhook_tolerance == timedelta(minutes=5)
    assert s.unsubscribe_url == "http://127.0.0.1:8025/unsubscribe/{customer_id}?token={token}"
    assert s.unsubscribe_secret == DEMO_UNSUBSCRIBE_SECRET


def test_each_provider_gets_its_keys_and_a_rotation_gives_one_two():
    env = {
        "DIGEST_WEBHOOK_SECRETS": f"resend={WHSEC_A}, resend={WHSEC_B},postmark=plain-shared-secret-1234",
        "DIGEST_WEBHOOK_TOLERANCE_SECONDS": "60",
    }
    s = load_settings(env, ROOT)
    assert s.webhook_keys() == {
        "resend": (KEY_A, KEY_B),
        "postmark": (b"plain-shared-secret-1234",),
    }
    assert s.webhook_tolerance == timedelta(seconds=60)
    assert WHSEC_A not in repr(s)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (WHSEC_A, "entry 1: use PROVIDER=SECRET"),
        (f"Resend={WHSEC_A}", "entry 1: use PROVIDER=SECRET"),
        (f"resend={WHSEC_A},=x", "entry 2: use PROVIDER=SECRET"),
        ("resend=whsec_***", "entry 1 (resend): a whsec_ secret must be whsec_ and base64"),
        ("resend=tiny-1", "entry 1 (resend): the key is shorter than 16 bytes"),
    ],
)
def test_a_bad_entry_is_one_line_naming_it_never_its_secret(value, says):
    with pytest.raises(InvalidSetting) as e:
        load_settings({"DIGEST_WEBHOOK_SECRETS": value}, ROOT)
    message = str(e.value)
    assert message.startswith("DIGEST_WEBHOOK_SECRETS ")
    assert says in message
    assert "\n" not in message
    secret = value.partition("=")[2] or value
    assert secret not in message


def test_by_default_digest_serve_closes_a_slow_client_within_seconds():
    limits = load_settings({}, ROOT).serve_limits
    assert limits == ServeLimits(
        header_timeout=timedelta(seconds=10),
        body_timeout=timedelta(seconds=10),
        keep_alive=timedelta(seconds=10),
        max_connections=512,
    )


def test_each_serve_limit_is_read_from_its_variable():
    env = {
        "DIGEST_SERVE_HEADER_TIMEOUT_SECONDS": "2.5",
        "DIGEST_SERVE_BODY_TIMEOUT_SECONDS": "30",
        "DIGEST_SERVE_KEEP_ALIVE_SECONDS": " 0.1 ",
        "DIGEST_SERVE_MAX_CONNECTIONS": "100000",
    }
    assert load_settings(env, ROOT).serve_limits == ServeLimits(
        timedelta(seconds=2.5), timedelta(seconds=30), timedelta(seconds=0.1), 100_000
    )


SECONDS = "must be a number of seconds from 0.1 to 3600"


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        (
            "DIGEST_SERVE_HEADER_TIMEOUT_SECONDS",
            "0",
            SECONDS,
        ),  # never wait: no request could arrive
        ("DIGEST_SERVE_HEADER_TIMEOUT_SECONDS", "3601", SECONDS),  # over an hour is no deadline
        ("DIGEST_SERVE_BODY_TIMEOUT_SECONDS", "-1", SECONDS),
        ("DIGEST_SERVE_BODY_TIMEOUT_SECONDS", "nan", SECONDS),
        ("DIGEST_SERVE_KEEP_ALIVE_SECONDS", "inf", SECONDS),
        ("DIGEST_SERVE_KEEP_ALIVE_SECONDS", "5s", SECONDS),  # a number, without a unit
        ("DIGEST_SERVE_MAX_CONNECTIONS", "0", "must be a whole number from 1 to 100000"),
        ("DIGEST_SERVE_MAX_CONNECTIONS", "1.5", "must be a whole number from 1 to 100000"),
        ("DIGEST_SERVE_MAX_CONNECTIONS", "100001", "must be a whole number from 1 to 100000"),
    ],
)
def test_a_bad_serve_limit_is_one_line_naming_its_variable_and_range(name, value, says):
    with pytest.raises(InvalidSetting) as e:
        load_settings({name: value}, ROOT)
    assert str(e.value) == f"{name}={value!r}: {says}"
