from datetime import timedelta
from pathlib import Path

import pytest

from digest_pipeline.domain.model import CleanupMode
from digest_pipeline.settings import InvalidSetting, load_settings

ROOT = Path("/srv/shop")


def test_every_setting_has_a_working_embedded_default():
    s = load_settings({}, ROOT)
    assert s.database_url == "sqlite:////srv/shop/.digest/digest.db"
    assert (s.mailer, s.outbox_dir) == ("outbox", ROOT / ".digest" / "outbox")
    assert s.cleanup_mode is CleanupMode.ARCHIVE
    assert s.policy.retry.max_attempts >= 1
    assert s.instance == "digest"


def test_the_instance_is_the_one_digest_instance_names():
    assert load_settings({"DIGEST_INSTANCE": " vip_digest "}, ROOT).instance == "vip_digest"


@pytest.mark.parametrize(("mailer", "concurrency"), [("outbox", 256), ("smtp", 16), ("http", 16)])
def test_concurrency_defaults_to_what_the_mailer_allows(mailer, concurrency):
    # a relay or provider takes about 16 connections; the outbox's sends are local file links
    env = {
        "DIGEST_MAILER": mailer,
        "DIGEST_SMTP_HOST": "relay.internal",
        "DIGEST_PROVIDER_URL": "https://api.provider.example/send",
        "DIGEST_PROVIDER_API_KEY": "key",
    }
    assert load_settings(env, ROOT).concurrency == concurrency
    assert load_settings({**env, "DIGEST_CONCURRENCY": "8"}, ROOT).concurrency == 8


def test_settings_are_read_from_the_digest_variables():
    s = load_settings(
        {
            "DIGEST_DATABASE_URL": "postgresql://u@db:5432/shop",
            "DIGEST_MAILER": "smtp",
            "DIGEST_SMTP_HOST": "relay.internal",
            "DIGEST_RETRY_BASE_SECONDS": "2.5",
            "DIGEST_RETRY_CAP_SECONDS": "60",
            "DIGEST_RETRY_MAX_ATTEMPTS": "3",
            "DIGEST_RETRY_MAX_AGE_SECONDS": "3600",
            "DIGEST_LEASE_SECONDS": "45",
            "DIGEST_BATCH_SIZE": "1",
            "DIGEST_CONCURRENCY": "4",
            "DIGEST_CLEANUP_MODE": "delete",
        },
        ROOT,
    )
    assert s.database_url == "postgresql://u@db:5432/shop"
    assert s.policy.retry.base == timedelta(seconds=2.5)
    assert (s.policy.retry.max_attempts, s.policy.lease) == (3, timedelta(seconds=45))
    assert (s.batch_size, s.concurrency, s.cleanup_mode) == (1, 4, CleanupMode.DELETE)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DIGEST_RETRY_MAX_ATTEMPTS", "0"),  # at least one attempt
        ("DIGEST_RETRY_MAX_ATTEMPTS", "three"),  # not a number
        ("DIGEST_RETRY_BASE_SECONDS", "-1"),  # delays are positive
        ("DIGEST_LEASE_SECONDS", "nan"),  # NaN lies in no range
        ("DIGEST_MAILER", "carrier-pigeon"),  # one of outbox, smtp, http
        ("DIGEST_CLEANUP_MODE", "shred"),  # archive or delete
        ("DIGEST_BATCH_SIZE", "0"),
        ("DIGEST_FROM_ADDRESS", "not an address"),
        ("DIGEST_FROM_ADDRESS", "a@shop.example, b@shop.example"),  # one sender
        ("DIGEST_FROM_ADDRESS", "digest@"),  # the parser crashes on this one
        ("DIGEST_FROM_ADDRESS", "x@["),
        ("DIGEST_SEND_RATE", "0"),  # no pace is an unset rate, not a zero one
        ("DIGEST_SEND_RATE", "inf"),
        ("DIGEST_SEND_RATE", "two"),
        ("DIGEST_INSTANCE", "Bad-Name"),  # no Dagster asset key or job name takes it
        ("DIGEST_INSTANCE", "vip:digest"),  # ':' separates an operation key's parts
    ],
)
def test_a_bad_value_is_a_one_line_error_naming_the_variable(name, value):
    with pytest.raises(InvalidSetting) as e:
        load_settings({name: value}, ROOT)
    assert name in str(e.value)
    assert "\n" not in str(e.value)


def test_a_cap_below_the_base_is_refused():
    with pytest.raises(InvalidSetting, match="cap"):
        load_settings({"DIGEST_RETRY_BASE_SECONDS": "60", "DIGEST_RETRY_CAP_SECONDS": "10"}, ROOT)


def test_smtp_settings_default_the_port_from_the_security_mode_and_hide_the_password():
    s = load_settings(
        {
            "DIGEST_MAILER": "smtp",
            "DIGEST_SMTP_HOST": "relay.internal",
            "DIGEST_SMTP_SECURITY": "tls",
            "DIGEST_SMTP_USERNAME": "digest",
            "DIGEST_SMTP_PASSWORD": "hunter2",
        },
        ROOT,
    )
    assert s.smtp is not None
    assert (s.smtp.port, s.smtp.security, s.smtp.username) == (465, "tls", "digest")
    assert "hunter2" not in repr(s)


def test_provider_settings_hide_the_api_key():
    s = load_settings(
        {
            "DIGEST_MAILER": "http",
            "DIGEST_PROVIDER_URL": "https://api.provider.example/",
            "DIGEST_PROVIDER_API_KEY": "re_secret",
        },
        ROOT,
    )
    assert s.provider is not None
    assert s.provider.url == "https://api.provider.example"
    assert s.provider.idempotency_window == timedelta(hours=24)
    assert "re_secret" not in repr(s)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DIGEST_MAILER": "smtp"}, "DIGEST_SMTP_HOST is required"),
        ({"DIGEST_MAILER": "http"}, "DIGEST_PROVIDER_URL and DIGEST_PROVIDER_API_KEY"),
        ({"DIGEST_SMTP_HOST": "h", "DIGEST_SMTP_PORT": "70000"}, "DIGEST_SMTP_PORT"),
        ({"DIGEST_SMTP_HOST": "h", "DIGEST_SMTP_SECURITY": "ssl3"}, "DIGEST_SMTP_SECURITY"),
        ({"DIGEST_UNSUBSCRIBE_URL": "https://x.example/u"}, "DIGEST_UNSUBSCRIBE_URL"),
    ],
)
def test_incomplete_mailer_settings_are_refused(env, message):
    with pytest.raises(InvalidSetting, match=message):
        load_settings(env, ROOT)


def test_operators_are_a_comma_separated_list_and_empty_means_anyone():
    assert load_settings({}, ROOT).operators == frozenset()
    listed = load_settings({"DIGEST_OPERATORS": " alice, bob ,,"}, ROOT).operators
    assert listed == frozenset({"alice", "bob"})


@pytest.mark.parametrize("sender", ["digest@shop.example", "Example Shop <digest@shop.example>"])
def test_a_sender_may_carry_a_display_name(sender):
    assert load_settings({"DIGEST_FROM_ADDRESS": sender}, ROOT).from_address == sender
