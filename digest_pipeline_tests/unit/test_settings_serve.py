"""`digest serve`'s settings: webhook secrets per provider, the replay window, the default link."""

import base64
from datetime import timedelta
from pathlib import Path

import pytest

from digest_pipeline.domain.unsubscribe import DEMO_UNSUBSCRIBE_SECRET
from digest_pipeline.settings import InvalidSetting, load_settings

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
