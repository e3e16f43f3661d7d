"""`DIGEST_MAILER=ses`: its settings are read only then, checked at start, refused in one line."""

from pathlib import Path

import pytest

from digest_pipeline.adapters.mail.ses import SesMailer
from digest_pipeline.settings import InvalidSetting, load_settings
from digest_pipeline.wiring import build_mailer

ROOT = Path("/srv/shop")
SES = {"DIGEST_MAILER": "ses", "DIGEST_SES_REGION": "eu-west-1"}
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def test_ses_settings_are_read_from_the_variables():
    s = load_settings(
        {
            **SES,
            "DIGEST_SES_ENDPOINT_URL": "https://vpce-0a1b.email.eu-west-1.vpce.amazonaws.com/",
            "DIGEST_SES_CONFIGURATION_SET": "digest-events_1",
            "DIGEST_PROVIDER_TIMEOUT_SECONDS": "7.5",
            "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
            "AWS_SECRET_ACCESS_KEY": SECRET,
        },
        ROOT,
    )
    assert s.ses is not None
    assert (s.ses.region, s.ses.endpoint_url, s.ses.configuration_set) == (
        "eu-west-1",
        "https://vpce-0a1b.email.eu-west-1.vpce.amazonaws.com",
        "digest-events_1",
    )
    assert (s.ses.timeout_seconds, s.ses.access_key_id) == (7.5, "AKIAIOSFODNN7EXAMPLE")
    assert (s.ses.secret_access_key, s.ses.session_token) == (SECRET, None)
    assert (s.mailer, s.concurrency) == ("ses", 16)
    assert SECRET not in repr(s)


def test_without_keys_boto3s_default_chain_is_used():
    s = load_settings({**SES, "AWS_SESSION_TOKEN": "stray"}, ROOT)
    assert s.ses is not None
    assert (s.ses.access_key_id, s.ses.secret_access_key, s.ses.session_token) == (None,) * 3
    assert (s.ses.endpoint_url, s.ses.configuration_set, s.ses.timeout_seconds) == (None, None, 10)


def test_temporary_keys_keep_their_session_token():
    env = {
        **SES,
        "AWS_ACCESS_KEY_ID": "ASIAX",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_SESSION_TOKEN": "t",
    }
    s = load_settings(env, ROOT)
    assert s.ses is not None
    assert s.ses.session_token == "t"


def test_ses_settings_are_not_read_for_another_mailer():
    # a stray SES variable cannot stop an outbox install
    assert load_settings({"DIGEST_SES_REGION": "not a region"}, ROOT).ses is None


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"DIGEST_MAILER": "ses"}, "DIGEST_SES_REGION is required"),
        ({**SES, "DIGEST_SES_REGION": "Ireland"}, "DIGEST_SES_REGION='Ireland'"),
        ({**SES, "DIGEST_SES_REGION": "eu-west-1\nx"}, "DIGEST_SES_REGION="),
        ({**SES, "DIGEST_SES_ENDPOINT_URL": "ftp://ses.example"}, "DIGEST_SES_ENDPOINT_URL:"),
        ({**SES, "DIGEST_SES_ENDPOINT_URL": "https://"}, "DIGEST_SES_ENDPOINT_URL:"),
        ({**SES, "DIGEST_SES_ENDPOINT_URL": "https://h:99999"}, "DIGEST_SES_ENDPOINT_URL:"),
        (
            {**SES, "DIGEST_SES_ENDPOINT_URL": "https://ses.example/?a=1"},
            "DIGEST_SES_ENDPOINT_URL:",
        ),
        ({**SES, "DIGEST_SES_CONFIGURATION_SET": "digest events"}, "DIGEST_SES_CONFIGURATION_SET="),
        ({**SES, "DIGEST_SES_CONFIGURATION_SET": "x" * 65}, "DIGEST_SES_CONFIGURATION_SET="),
        ({**SES, "AWS_SECRET_ACCESS_KEY": SECRET}, "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
        ({**SES, "AWS_ACCESS_KEY_ID": "AKIAX"}, "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
        ({**SES, "DIGEST_PROVIDER_TIMEOUT_SECONDS": "0"}, "DIGEST_PROVIDER_TIMEOUT_SECONDS="),
    ],
)
def test_a_bad_ses_setting_is_one_line_naming_the_variable(env, names):
    with pytest.raises(InvalidSetting) as refused:
        load_settings(env, ROOT)
    line = str(refused.value)
    assert names in line
    assert "\n" not in line
    assert SECRET not in line


def test_a_refused_endpoint_url_is_not_repeated():
    # it may hold a user and password
    env = {**SES, "DIGEST_SES_ENDPOINT_URL": "https://user:hunter2@ses.example"}
    with pytest.raises(InvalidSetting) as refused:
        load_settings(env, ROOT)
    assert "hunter2" not in str(refused.value)


def test_the_ses_mailer_is_built_without_io_with_a_connection_per_send_in_flight():
    env = {**SES, "DIGEST_CONCURRENCY": "24", "DIGEST_SES_ENDPOINT_URL": "http://127.0.0.1:9"}
    mailer = build_mailer(load_settings(env, ROOT))
    assert isinstance(mailer, SesMailer)
    assert mailer.identity.startswith("ses:")
    recipe = mailer.recipe()
    assert recipe is not None
    assert recipe().identity == mailer.identity
