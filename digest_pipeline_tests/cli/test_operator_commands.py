"""The operator commands against a real ledger (SQLite and PostgreSQL) after a real, mixed run.

Exit codes, JSON shapes, audit rows, the replay cap and refusals, the operator list, and that
every refused or dry-run command leaves every table (and the outbox) exactly as it was.
"""

import logging
import re

import pytest

from digest_pipeline.adapters.mail.outbox import OutboxMailer
from digest_pipeline_tests.builders import key_of, seed_period
from digest_pipeline_tests.cli.conftest import (
    CUSTOMERS,
    DEAD,
    FAILED,
    OS_USER,
    PERMANENT,
    SENT,
    UNKNOWN,
    Cli,
    ScriptedMailer,
)
from digest_pipeline_tests.cli.operator_steps import (
    COMMANDS,
    W41,
    P,
    assert_refused,
    k,
    refused_changes_nothing,
    replay_argv,
)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_operator_command_has_help(command, clock, capsys):
    assert Cli({}, clock)(command, "--help").code == 0
    assert f"usage: digest {command}" in capsys.readouterr().out


# -- items --------------------------------------------------------------------------------------


def test_items_lists_every_item_with_state_attempts_and_times(mixed):
    data = mixed.cli("items", "--period", P, "--json").json()
    by_key = {i["key"]: i for i in data["items"]}
    assert data["period"] == P
    assert len(by_key) == CUSTOMERS
    assert set(data["items"][0]) == {
        "key",
        "customer_id",
        "state",
        "attempts",
        "last_failure_class",
        "last_detail",
        "first_attempt_at",
        "last_attempt_at",
        "next_attempt_at",
        "lease_owner",
        "lease_expires_at",
        "provider_message_id",
        "sent_at",
        "cleaned_at",
        "replayed_at",
    }
    assert {by_key[k(n)]["state"] for n in SENT} == {"sent"}
    failed = by_key[k(2)]
    assert (failed["state"], failed["attempts"], failed["last_failure_class"]) == (
        "failed",
        1,
        "permanent",
    )
    assert failed["last_detail"] == "smtp:550"
    assert failed["first_attempt_at"] == "2026-10-19T06:00:00+00:00"
    assert (by_key[k(4)]["state"], by_key[k(4)]["attempts"]) == ("dead_lettered", 2)
    assert by_key[k(6)]["last_detail"] == "timeout_after_send"

    text = mixed.cli("items", "--period", P)
    assert text.code == 0
    assert f"period {P}: {CUSTOMERS} items" in text.out
    line = next(x for x in text.out.splitlines() if x.startswith(k(4)))
    assert line.split()[1:6] == ["customer-0004", "dead_lettered", "2", "transient", "smtp:421"]


def test_items_filters_by_state(mixed):
    data = mixed.cli("items", "--period", P, "--state", "unknown", "--json").json()
    assert [i["key"] for i in data["items"]] == [k(n) for n in UNKNOWN]
    assert data["state"] == "unknown"


def test_items_with_a_key_tells_that_items_story(mixed):
    assert mixed.cli(*replay_argv(P, k(4), reason="OPS-1", operator="alice")).code == 0
    story = mixed.cli("items", "--period", P, "--key", k(4), "--json").json()
    assert story["item"]["state"] == "pending"
    assert [(a["number"], a["outcome"], a["detail"]) for a in story["attempts"]] == [
        (1, "transient", "smtp:421"),
        (2, "transient", "smtp:421"),
    ]
    assert set(story["attempts"][0]) == {
        "number",
        "token",
        "worker",
        "started_at",
        "finished_at",
        "outcome",
        "detail",
        "provider_message_id",
        "duplicate",
    }
    [letter] = story["dead_letters"]
    assert (letter["reason"], letter["attempts"]) == ("max_attempts", 2)
    assert letter["replayed_at"] is not None
    [row] = story["audit"]
    assert (row["actor"], row["action"], row["from_state"], row["to_state"]) == (
        "alice",
        "replay",
        "dead_lettered",
        "pending",
    )

    text = mixed.cli("items", "--period", P, "--key", k(4)).out
    assert "attempts: 2" in text
    assert "dead letters: 1" in text
    assert "audit: 1" in text


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--state", "lost"], ["'lost' is not a state", "retry_scheduled, unknown"]),
        (["--key", "digest:2026-W41:customer-0001"], ["is not of period 2026-W42"]),
        (["--key", "customer-0001"], ["not of the form <instance>:2026-W42:<customer_id>"]),
        (["--key", "digest:2026-W42:nobody"], ["no work item for digest:2026-W42:nobody"]),
        (["--key", "digest:2026-W42:customer-0001", "--state", "sent"], ["drop --state"]),
        (["--period", "2026-W43"], ["has not ended yet"]),
    ],
)
def test_items_refuses_bad_input_in_one_line(mixed, argv, says):
    period = [] if "--period" in argv else ["--period", P]
    refused_changes_nothing(mixed, "items", *period, *argv, says=says)


# -- dead letters and audit ---------------------------------------------------------------------


def test_dead_letters_lists_reason_failure_class_attempts_and_times(mixed):
    data = mixed.cli("dead-letters", "--period", P, "--json").json()
    rows = {d["key"]: d for d in data["dead_letters"]}
    assert set(rows) == {k(n) for n in (*FAILED, *DEAD)}
    assert {n: (rows[k(n)]["reason"], rows[k(n)]["last_failure_class"]) for n in (2, 4)} == {
        2: ("permanent", "permanent"),
        4: ("max_attempts", "transient"),
    }
    assert set(rows[k(4)]) == {
        "key",
        "customer_id",
        "reason",
        "last_failure_class",
        "attempts",
        "first_attempt_at",
        "last_attempt_at",
        "created_at",
        "replayed_at",
    }
    text = mixed.cli("dead-letters", "--period", P).out
    assert f"period {P}: 4 dead-letter rows" in text
    assert sum(line.startswith("digest:") for line in text.splitlines()) == 4


def test_audit_lists_every_row_and_filters_by_period(mixed):
    other = key_of(1, W41)
    seed_period(mixed.ledger, 1, period=W41, now=mixed.clock.now())
    mailer = ScriptedMailer(OutboxMailer(mixed.outbox_dir))
    mailer.script(other, PERMANENT)
    mixed.deliver(mailer)
    assert mixed.cli(*replay_argv("2026-W41", other, reason="a", operator="alice")).code == 0
    assert mixed.cli(*replay_argv(P, k(2), reason="b")).code == 0  # as the OS user

    everything = mixed.cli("audit", "--json").json()
    assert everything["period"] is None
    assert [(r["actor"], r["key"]) for r in everything["audit"]] == [
        ("alice", str(other)),
        (OS_USER, k(2)),
    ]
    only = mixed.cli("audit", "--period", P, "--json").json()
    assert [r["reason"] for r in only["audit"]] == ["b (mailer_lookup_not_found)"]
    assert set(only["audit"][0]) == {
        "at",
        "actor",
        "action",
        "key",
        "period",
        "from_state",
        "to_state",
        "reason",
    }
    text = mixed.cli("audit", "--period", P).out
    assert f"period {P}: 1 audit rows" in text
    assert re.search(
        rf"{OS_USER} +replay +{k(2)} +failed -> pending +b \(mailer_lookup_not_found\)", text
    )


# -- reconcile and resolve ----------------------------------------------------------------------


def test_reconcile_settles_unknowns_on_the_outboxs_evidence_and_audits_it(mixed):
    data = mixed.cli("reconcile", "--period", P, "--json").json()
    assert data["changes"] == [
        {"key": k(n), "state": "sent", "evidence": "mailer_lookup_found"} for n in UNKNOWN
    ]
    assert (data["examined"], data["moved"], data["still_unknown"]) == (2, {"sent": 2}, 0)
    assert data["mailer"] == "outbox"
    audit = mixed.cli("audit", "--period", P, "--json").json()["audit"]
    assert {(r["actor"], r["key"], r["reason"]) for r in audit} == {
        ("system:reconcile", k(n), "evidence:mailer_lookup_found") for n in UNKNOWN
    }
    again = mixed.cli("reconcile", "--period", P)
    assert again.code == 0
    assert "0 unknown items examined" in again.out


def test_resolve_moves_an_unknown_item_and_audits_operator_and_reason(mixed):
    run = mixed.cli(
        "resolve",
        "--key",
        k(6),
        "--as",
        "not-sent",
        "--reason",
        "not in the relay log",
        "--operator",
        "alice",
        "--json",
    )
    data = run.json()
    assert data == {
        "key": k(6),
        "state": "retry_scheduled",
        "operator": "alice",
        "next_attempt_at": mixed.clock.now().isoformat(),
    }
    text = mixed.cli("resolve", "--key", k(7), "--as", "sent", "--reason", "relay says 250")
    assert text.code == 0
    assert f"{k(7)}: unknown -> sent (resolved by {OS_USER})" in text.out
    audit = mixed.cli("audit", "--json").json()["audit"]
    assert [(r["actor"], r["action"], r["key"], r["to_state"], r["reason"]) for r in audit] == [
        ("alice", "resolve", k(6), "retry_scheduled", "not in the relay log"),
        (OS_USER, "resolve", k(7), "sent", "relay says 250"),
    ]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--key", "digest:2026-W42:customer-0001", "--as", "sent"], ["is sent; only unknown"]),
        (["--key", "digest:2026-W42:customer-0002", "--as", "sent"], ["is failed; only unknown"]),
        (["--key", "digest:2026-W42:nobody", "--as", "sent"], ["no work item for"]),
        (["--key", "digest:2026-W42:customer-0006", "--as", "maybe"], ["sent or not-sent"]),
        (["--key", "2026-W42:customer-0006", "--as", "sent"], ["is not of the form"]),
    ],
)
def test_resolve_refuses_in_one_line_and_changes_nothing(mixed, argv, says):
    refused_changes_nothing(mixed, "resolve", *argv, "--reason", "checked", says=says)


def test_resolve_refuses_an_empty_reason(mixed):
    argv = ["--key", k(6), "--as", "sent", "--reason", "  "]
    refused_changes_nothing(mixed, "resolve", *argv, says=["needs a reason"])


def test_only_listed_operators_may_resolve_or_replay(mixed):
    only_alice = {"DIGEST_OPERATORS": "alice,bob"}
    resolve = ["--key", k(6), "--as", "sent", "--reason", "relay log", "--operator"]
    refused_changes_nothing(
        mixed, "resolve", *resolve, "mallory", env=only_alice, says=["'mallory' may not act"]
    )
    replay = replay_argv(P, k(2), operator="mallory")
    refused_changes_nothing(mixed, *replay, env=only_alice, says=["'mallory' may not act"])

    assert mixed.cli("resolve", *resolve, "alice", env=only_alice).code == 0
    assert mixed.cli(*replay_argv(P, k(2), operator="alice"), env=only_alice).code == 0
    audit = mixed.cli("audit", "--json").json()["audit"]
    assert {r["actor"] for r in audit} == {"alice"}


# -- sweep and logs -----------------------------------------------------------------------------


def test_sweep_reconciles_delivers_and_cleans_and_reports_it(mixed):
    assert mixed.cli(*replay_argv(P, k(2), k(4))).code == 0
    data = mixed.cli("sweep", "--json").json()
    assert data["periods"] == [P]
    assert data["recovered"] == {"requeued": [], "unknown": []}
    assert data["reconciled"][P]["changes"] == [
        {"key": k(n), "state": "sent", "evidence": "mailer_lookup_found"} for n in UNKNOWN
    ]
    assert data["delivered"] == {"claimed": 2, "by_state": {"sent": 2}, "lost_races": 0}
    cleaned = data["cleaned"][P]
    assert (cleaned["cleaned"], cleaned["rows"]) == (8, 16)
    assert cleaned["held_back"] == {"not_sent:dead_lettered": 1, "not_sent:failed": 1}
    assert sorted(mixed.outbox_files()) == sorted(
        f"digest_2026-W42_customer-{n:04d}.eml" for n in (*SENT, *UNKNOWN, 2, 4)
    )
    again = mixed.cli("sweep")
    assert again.code == 0
    assert "claimed     0" in again.out
    assert "open periods: none" in again.out


def test_debug_level_logs_every_item_with_its_operation_key(mixed):
    loud = mixed.cli("sweep", env={"DIGEST_LOG_LEVEL": "debug"})
    assert loud.code == 0
    assert f"DEBUG event=cleanup key={k(1)} status=cleaned rows=2" in loud.err.splitlines()


def test_log_lines_go_to_stderr_at_digest_log_level_and_the_handler_is_removed(mixed):
    logger = logging.getLogger("digest_pipeline")
    handlers, level = list(logger.handlers), logger.level
    quiet = mixed.cli("reconcile", "--period", P)
    assert quiet.err == ""
    loud = mixed.cli("sweep", env={"DIGEST_LOG_LEVEL": "info"})
    assert loud.code == 0
    lines = loud.err.splitlines()
    assert "INFO event=sweep periods=1 requeued=0 unknown=0 claimed=0 refused=0" in lines
    # per item only at DEBUG (a routine cleanup is not worth an event-log row), a summary at INFO
    assert any(line.startswith(f"INFO event=cleaned period={P} cleaned=") for line in lines)
    assert not any("event=cleanup " in line for line in lines)
    assert all(line.startswith("INFO event=") for line in lines)
    assert (logger.handlers, logger.level) == (handlers, level)

    bad = mixed.cli("audit", env={"DIGEST_LOG_LEVEL": "loud"})
    assert_refused(bad, "audit", "DIGEST_LOG_LEVEL='loud': must be one of DEBUG, INFO")
    assert (logger.handlers, logger.level) == (handlers, level)
