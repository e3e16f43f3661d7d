"""Which ledger databases may deliver: the refusal decided from the settings the database reports.

One row per rule: `fsync=off` or `synchronous_commit=off` is refused; every other
`synchronous_commit` value flushes the primary's WAL before a commit returns; SQLite reports
nothing (its engine makes each commit durable); `DIGEST_ALLOW_NONDURABLE_LEDGER` lets a
throwaway ledger through. The allowance itself is read as an on/off setting.
"""

from pathlib import Path

import pytest

from digest_pipeline.domain.durability import ALLOW_VARIABLE, durability_refusal, unsafe_settings
from digest_pipeline.settings import InvalidSetting, load_settings

DURABLE = {"fsync": "on", "synchronous_commit": "on"}


@pytest.mark.parametrize(
    ("reported", "unsafe"),
    [
        # the server's defaults
        (DURABLE, []),
        # each of these waits for the primary's own WAL flush; the rest is about standbys
        ({"fsync": "on", "synchronous_commit": "local"}, []),
        ({"fsync": "on", "synchronous_commit": "remote_write"}, []),
        ({"fsync": "on", "synchronous_commit": "remote_apply"}, []),
        # an operating system crash loses what was written but never flushed
        ({"fsync": "off", "synchronous_commit": "on"}, ["fsync=off"]),
        # a crash of the server alone loses the last commits still in its WAL buffers
        ({"fsync": "on", "synchronous_commit": "off"}, ["synchronous_commit=off"]),
        # scripts/pg-test-cluster.sh's cluster
        (
            {"fsync": "off", "synchronous_commit": "off"},
            ["fsync=off", "synchronous_commit=off"],
        ),
        # as a client might spell it back
        ({"fsync": " OFF ", "synchronous_commit": "On"}, ["fsync=off"]),
        # SQLite: its engine sets synchronous=FULL, so nothing is reported
        ({}, []),
    ],
)
def test_the_settings_that_can_lose_a_commit_are_named(reported, unsafe):
    assert unsafe_settings(reported) == unsafe


def test_a_ledger_that_can_lose_commits_is_refused_in_one_line_naming_the_settings():
    line = durability_refusal(
        {"fsync": "off", "synchronous_commit": "off"}, allowed=False, what="digest sweep"
    )
    assert line is not None
    assert line.startswith("digest sweep refused: ")
    assert "fsync=off and synchronous_commit=off" in line
    assert f"{ALLOW_VARIABLE}=1" in line
    assert "\n" not in line


def test_the_allowance_lets_a_throwaway_ledger_deliver():
    assert durability_refusal({"fsync": "off"}, allowed=True, what="delivery") is None


@pytest.mark.parametrize("reported", [DURABLE, {}])
def test_a_durable_ledger_needs_no_allowance(reported):
    assert durability_refusal(reported, allowed=False, what="delivery") is None


@pytest.mark.parametrize(
    ("raw", "allowed"),
    [(None, False), ("", False), ("0", False), ("no", False), ("1", True), ("TRUE", True)],
)
def test_the_allowance_is_an_on_off_setting(raw, allowed):
    env = {} if raw is None else {ALLOW_VARIABLE: raw}
    assert load_settings(env, Path.cwd()).allow_nondurable_ledger is allowed


def test_an_allowance_that_is_neither_on_nor_off_is_refused():
    with pytest.raises(InvalidSetting, match=ALLOW_VARIABLE):
        load_settings({ALLOW_VARIABLE: "maybe"}, Path.cwd())
