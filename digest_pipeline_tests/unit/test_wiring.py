from pathlib import Path

import pytest

from digest_pipeline.adapters.mail.http import HttpProviderMailer
from digest_pipeline.adapters.mail.outbox import OutboxMailer
from digest_pipeline.adapters.mail.render import Jinja2Composer
from digest_pipeline.adapters.mail.smtp import SmtpMailer
from digest_pipeline.domain.model import WorkItem
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.settings import load_settings
from digest_pipeline.wiring import build_composer, build_mailer
from digest_pipeline_tests.builders import digest_rows_for, email_of, key_of
from digest_pipeline_tests.conftest import T0
from digest_pipeline_tests.fakes import FixedClock


@pytest.mark.parametrize(
    ("env", "kind"),
    [
        ({}, OutboxMailer),  # the embedded default
        ({"DIGEST_MAILER": "smtp", "DIGEST_SMTP_HOST": "relay.invalid"}, SmtpMailer),
        (
            {
                "DIGEST_MAILER": "http",
                "DIGEST_PROVIDER_URL": "https://api.invalid",
                "DIGEST_PROVIDER_API_KEY": "k",
            },
            HttpProviderMailer,
        ),
    ],
)
def test_the_configured_mailer_is_built_without_io(env, kind, tmp_path):
    mailer = build_mailer(load_settings(env, tmp_path))
    assert isinstance(mailer, kind)


def test_the_outbox_lives_under_the_project_folder_by_default(tmp_path):
    mailer = build_mailer(load_settings({}, tmp_path))
    assert isinstance(mailer, OutboxMailer)
    assert mailer.directory == tmp_path / ".digest" / "outbox"
    assert not Path(tmp_path / ".digest").exists()  # nothing created until the first send


def test_the_composer_uses_the_configured_sender(tmp_path):
    composer = build_composer(
        load_settings({"DIGEST_FROM_ADDRESS": "news@shop.example"}, tmp_path), FixedClock(T0)
    )
    key = key_of(1)
    item = WorkItem(key, DeliveryState.CLAIMED, T0, None)
    message = composer.compose(item, email_of(1), digest_rows_for(key, 1))
    assert isinstance(composer, Jinja2Composer)
    assert message.sender == "news@shop.example"
