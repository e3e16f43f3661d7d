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


def test_settings_are_read_from_the_digest_variables():
    s = load_settings(
        {
            "DIGEST_DATABASE_URL": "postgresql://u@db:5432/shop",
            "DIGEST_MAILER": "smtp",
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
        ("DIGEST_LEASE_SECONDS", "nan"),  # NaN is not positive
        ("DIGEST_MAILER", "carrier-pigeon"),  # one of outbox, smtp, http
        ("DIGEST_CLEANUP_MODE", "shred"),  # archive or delete
        ("DIGEST_BATCH_SIZE", "0"),
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
