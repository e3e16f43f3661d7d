"""Every `DIGEST_*` number has a finite, documented range, and the database URL a known scheme.

The motivating examples come first, with their ranges written out, so each fails for its own
stated reason; the table-driven tests then walk every range the module declares.
"""

from datetime import timedelta
from pathlib import Path

import pytest

from digest_pipeline.settings import InvalidSetting, load_settings

ROOT = Path("/srv/shop")
#: what the SMTP and HTTP settings need before their own numbers are read
NEEDS = {
    "DIGEST_SMTP": {"DIGEST_SMTP_HOST": "relay.internal"},
    "DIGEST_PROVIDER": {
        "DIGEST_PROVIDER_URL": "https://api.provider.example",
        "DIGEST_PROVIDER_API_KEY": "re_key",
    },
}


def _refused(env: dict[str, str]) -> str:
    with pytest.raises(InvalidSetting) as e:
        load_settings(env, ROOT)
    message = str(e.value)
    assert "\n" not in message
    return message


def _context(name: str) -> dict[str, str]:
    return next((env for prefix, env in NEEDS.items() if name.startswith(prefix)), {})


@pytest.mark.parametrize(
    ("name", "value", "stated_range"),
    [
        # OverflowError from timedelta() before: a traceback instead of one line
        ("DIGEST_RETRY_BASE_SECONDS", "inf", "from 0.001 to 86400 (1 day)"),
        ("DIGEST_LEASE_SECONDS", "1e400", "from 1 to 2592000 (30 days)"),
        # accepted before, then `now + lease` overflowed in the middle of a delivery step
        ("DIGEST_LEASE_SECONDS", "1e12", "from 1 to 2592000 (30 days)"),
        ("DIGEST_DELIVERY_WINDOW_SECONDS", "1e12", "from 1 to 31622400 (366 days)"),
        ("DIGEST_RETRY_MAX_ATTEMPTS", "1000000000000", "from 1 to 1000"),
        ("DIGEST_CONCURRENCY", "100000", "from 1 to 1024"),
    ],
)
def test_the_issues_out_of_range_numbers_are_one_line_naming_the_variable_and_its_range(
    name, value, stated_range
):
    message = _refused({name: value})
    assert message.startswith(f"{name}={value!r}: ")
    assert stated_range in message


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("mysql://shop:s3cret@db.internal/shop", "the scheme mysql:// is not supported"),
        ("postgresql+asyncpg://db.internal/shop", "the scheme postgresql+asyncpg://"),
        ("sqlite:///", "names no SQLite file"),  # no path: SQLAlchemy opens memory
        ("sqlite://", "names no SQLite file"),  # in memory: gone when the command ends
        ("sqlite:///:memory:", "names no SQLite file"),
        ("not a url", "is not a database URL"),
        ("postgresql://shop:s3cret@db.internal:port/shop", "is not a database URL"),
    ],
)
def test_only_a_sqlite_file_or_postgresql_is_a_ledger_url(url, says):
    message = _refused({"DIGEST_DATABASE_URL": url})
    assert message.startswith("DIGEST_DATABASE_URL")
    assert says in message
    assert "s3cret" not in message  # the refusal never repeats the URL


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:////srv/shop/ledger.db",
        "sqlite:///relative/ledger.db",
        "sqlite+pysqlite:////srv/shop/ledger.db",
        "postgresql://shop@db.internal:5432/shop",
        "postgresql+psycopg://shop@db.internal/shop",
        "postgresql+psycopg2://shop@db.internal/shop",
    ],
)
def test_the_supported_ledger_urls_are_accepted(url):
    assert load_settings({"DIGEST_DATABASE_URL": url}, ROOT).database_url == url


def _seconds_ranges() -> list[tuple[str, float, float]]:
    from digest_pipeline.settings import SECONDS_RANGES

    return [(name, low, high) for name, (low, high) in SECONDS_RANGES.items()]


def _int_ranges() -> list[tuple[str, int, int]]:
    from digest_pipeline.settings import INT_RANGES

    return [(name, low, high) for name, (low, high) in INT_RANGES.items()]


def _with_partner(name: str, value: float) -> dict[str, str]:
    """`name=value`, with the retry cap raised or the base lowered to match if need be (the cap
    may not fall below the base), and what the mailer's settings need."""
    env = {**_context(name), name: repr(value)}
    if name == "DIGEST_RETRY_BASE_SECONDS" and value > 3600:
        env["DIGEST_RETRY_CAP_SECONDS"] = repr(value)
    if name == "DIGEST_RETRY_CAP_SECONDS" and value < 30:
        env["DIGEST_RETRY_BASE_SECONDS"] = repr(value)
    return env


@pytest.mark.parametrize(("name", "low", "high"), _seconds_ranges())
def test_every_duration_accepts_its_bounds_and_refuses_anything_outside_them(name, low, high):
    for bound in (low, high):
        load_settings(_with_partner(name, bound), ROOT)
    for bad in (low / 2, high * 1.001, 0, -1, "inf", "-inf", "nan", "1e400", "soon"):
        message = _refused({**_context(name), name: str(bad)})
        assert message.startswith(f"{name}=")
        assert "must be a number of seconds from " in message


@pytest.mark.parametrize(("name", "low", "high"), _int_ranges())
def test_every_whole_number_accepts_its_bounds_and_refuses_anything_outside_them(name, low, high):
    for bound in (low, high):
        load_settings({**_context(name), name: str(bound)}, ROOT)
    for bad in (low - 1, high + 1, "1.5", "1e3", "inf", "9" * 5000, "many"):
        message = _refused({**_context(name), name: str(bad)})
        assert message.startswith(f"{name}=")
        assert f"must be a whole number from {low} to {high}" in message


def test_the_defaults_lie_inside_their_ranges():
    s = load_settings({**NEEDS["DIGEST_SMTP"], **NEEDS["DIGEST_PROVIDER"]}, ROOT)
    assert s.policy.lease == timedelta(minutes=2)
    assert s.smtp is not None
    assert s.smtp.timeout_seconds == 30
    assert s.provider is not None
    assert s.provider.idempotency_window == timedelta(hours=24)


def test_the_settings_page_states_every_range_on_its_variables_row():
    # docs/reference/settings.md's table is this rendering (docs/hooks/reference.py)
    from digest_pipeline.settings import INT_RANGES, SECONDS_RANGES, range_text
    from digest_pipeline.settings_catalogue import render_markdown

    rows = [line for line in render_markdown().splitlines() if line.startswith("| `DIGEST_")]
    for name in {**SECONDS_RANGES, **INT_RANGES}:
        row = next((r for r in rows if f"`{name}`" in r), None)
        assert row is not None, f"no row for {name}"
        assert range_text(name) in row, name
