"""The settings catalogue (the documentation's table) names exactly the `DIGEST_*` variables the code reads.

Two witnesses: every key the settings readers ask a recording mapping for, under environments that
take each branch, and every `"DIGEST_…"` string literal in the package's source.
"""

import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from digest_pipeline import settings_catalogue
from digest_pipeline.cli.context import log_level
from digest_pipeline.executor_settings import load_executor_settings
from digest_pipeline.settings import InvalidSetting, load_first_week, load_settings

PACKAGE = Path(settings_catalogue.__file__).resolve().parent
ROOT = PACKAGE.parent
LITERAL = re.compile(r"[\"'](DIGEST_[A-Z0-9_]*[A-Z0-9])[\"']")
# the test and benchmark rigs hand their worker processes private variables; not settings
RIGS = PACKAGE / "rigs"


class Recording(Mapping[str, str]):
    """An environment that records every key asked of it, however it is asked."""

    def __init__(self, values: dict[str, str]) -> None:
        self._data = values
        self.asked: set[str] = set()

    def __getitem__(self, key: str) -> str:
        self.asked.add(key)
        return self._data[key]

    def get(self, key: str, default: object = None) -> object:  # type: ignore[override]
        self.asked.add(key)
        return self._data.get(key, default)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.asked.add(key)
        return key in self._data

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


#: environments that take every branch of the readers: each mailer, the Celery executor
BRANCHES: tuple[dict[str, str], ...] = (
    {},
    {"DIGEST_MAILER": "smtp", "DIGEST_SMTP_HOST": "relay.example", "DIGEST_SMTP_USERNAME": "u"},
    {
        "DIGEST_MAILER": "http",
        "DIGEST_PROVIDER_URL": "https://api.example",
        "DIGEST_PROVIDER_API_KEY": "k",
    },
    {"DIGEST_MAILER": "ses", "DIGEST_SES_REGION": "eu-west-1"},
    {"DIGEST_EXECUTOR": "celery", "DIGEST_CELERY_BROKER_URL": "redis://127.0.0.1:6379/0"},
)


def asked_by_the_readers() -> set[str]:
    asked: set[str] = set()
    for values in BRANCHES:
        env = Recording(dict(values))
        load_settings(env, ROOT)
        load_executor_settings(env)
        load_first_week(env)
        log_level(env)
        asked |= env.asked
    return {k for k in asked if k.startswith("DIGEST_")}


def literals_in_the_source() -> set[str]:
    found: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        if RIGS in path.parents:
            continue
        found |= set(LITERAL.findall(path.read_text(encoding="utf-8")))
    return found


def documented(names: set[str]) -> set[str]:
    return {n for n in names if not n.startswith("DIGEST_TEST_")}


def test_the_catalogue_names_every_variable_the_readers_ask_for_and_no_other():
    assert documented(asked_by_the_readers()) == set(settings_catalogue.names())


def test_every_digest_literal_in_the_package_is_catalogued():
    missing = documented(literals_in_the_source()) - set(settings_catalogue.names())
    assert missing == set()


def test_the_catalogue_names_each_variable_once():
    names = [s.name for s in settings_catalogue.SETTINGS]
    assert len(names) == len(set(names))


def test_the_recording_environment_sees_a_refused_value_too():
    env = Recording({"DIGEST_MAILER": "carrier-pigeon"})
    with pytest.raises(InvalidSetting):
        load_settings(env, ROOT)
    assert "DIGEST_MAILER" in env.asked


def test_the_rendered_table_has_a_row_per_variable():
    rows = [r for r in settings_catalogue.render_markdown().splitlines() if r.startswith("| `")]
    assert [r.split("`")[1] for r in rows] == [s.name for s in settings_catalogue.SETTINGS]
