"""`digest replay` from the command line: the plan, the audit, the refusals, the cap and the keys file."""

import pytest

from digest_pipeline.adapters.mail.outbox import OutboxMailer
from digest_pipeline_tests.builders import seed_period
from digest_pipeline_tests.cli.conftest import (
    PERMANENT,
    ScriptedMailer,
)
from digest_pipeline_tests.cli.operator_steps import (
    P,
    k,
    refused_changes_nothing,
    replay_argv,
)

# -- replay -------------------------------------------------------------------------------------


def test_a_dry_run_replay_shows_the_plan_per_key_and_changes_nothing(mixed):
    before, files = mixed.dump(), mixed.outbox_files()
    run = mixed.cli(*replay_argv(P, k(2), k(4), k(5)), "--dry-run", "--json")
    data = run.json()
    assert data["dry_run"] is True
    assert data["keys"] == [
        {
            "key": k(n),
            "state": s,
            "plan": "replay",
            "evidence": "mailer_lookup_not_found",
            "possible_send": None,
        }
        for n, s in ((2, "failed"), (4, "dead_lettered"), (5, "dead_lettered"))
    ]
    assert (data["accept_possible_duplicate"], data["possible_duplicates"]) == (False, [])
    text = mixed.cli(*replay_argv(P, k(2)), "--dry-run")
    assert "would replay 1 of 1 keys" in text.out
    assert "dry run: nothing changed" in text.out
    assert mixed.dump() == before
    assert mixed.outbox_files() == files


def test_a_replay_reopens_the_keys_audits_them_and_says_the_sweep_delivers(mixed):
    run = mixed.cli(*replay_argv(P, k(2), k(4), reason="OPS-7 mailbox fixed"))
    assert run.code == 0, run.err
    assert "replayed 2 of 2 keys" in run.out
    assert "the next digest sweep or sensor run delivers them" in run.out
    states = {
        i["key"]: i["state"] for i in mixed.cli("items", "--period", P, "--json").json()["items"]
    }
    assert (states[k(2)], states[k(4)], states[k(5)]) == ("pending", "pending", "dead_lettered")
    audit = mixed.cli("audit", "--json").json()["audit"]
    assert [(r["actor"], r["key"], r["from_state"], r["to_state"], r["reason"]) for r in audit] == [
        ("alice", k(2), "failed", "pending", "OPS-7 mailbox fixed (mailer_lookup_not_found)"),
        (
            "alice",
            k(4),
            "dead_lettered",
            "pending",
            "OPS-7 mailbox fixed (mailer_lookup_not_found)",
        ),
    ]


@pytest.mark.parametrize(
    ("keys", "says"),
    [
        pytest.param(
            ["digest:2026-W42:customer-0002", "digest:2026-W41:customer-0003"],
            ["digest:2026-W41:customer-0003 is not of period 2026-W42"],
            id="other-period",
        ),
        pytest.param(
            ["digest:2026-W42:customer-0002", "digest:2026-W42:nobody"],
            ["digest:2026-W42:nobody is unknown"],
            id="unknown-key",
        ),
        pytest.param(
            ["digest:2026-W42:customer-0002", "digest:2026-W42:customer-0001"],
            ["digest:2026-W42:customer-0001 is sent, not dead_lettered or failed"],
            id="sent-key",
        ),
        pytest.param(
            ["digest:2026-W42:customer-0006"],
            ["digest:2026-W42:customer-0006 is unknown, not dead_lettered or failed"],
            id="unknown-state",
        ),
    ],
)
def test_a_refused_replay_names_the_key_and_changes_nothing(mixed, keys, says):
    refused_changes_nothing(mixed, *replay_argv(P, *keys), says=["nothing changed", *says])


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--max-keys", "0"], ["--max-keys must be at least 1"]),
        (["--keys-file", "/nonexistent/keys.txt"], ["not both"]),
        (["--operator", " "], ["--operator must name someone"]),
        (["--reason", " "], ["needs an operator and a reason"]),
        (["--period", "2026-W43"], ["has not ended yet"]),
    ],
)
def test_a_bad_replay_request_is_one_line_and_changes_nothing(mixed, extra, says):
    refused_changes_nothing(mixed, *replay_argv(P, k(2)), *extra, says=says)


def test_a_replay_needs_keys(mixed):
    argv = ["--period", P, "--reason", "r", "--operator", "alice"]
    refused_changes_nothing(mixed, "replay", *argv, says=["--key K [--key K ...] or --keys-file F"])


def test_a_keys_file_ignores_comments_and_names_the_line_of_a_bad_key(mixed, tmp_path):
    good = tmp_path / "keys.txt"
    good.write_text(f"# OPS-7\n\n{k(2)}  # mailbox fixed\n{k(3)}\n", encoding="utf-8")
    data = mixed.cli(*replay_argv(P), "--keys-file", str(good), "--dry-run", "--json").json()
    assert [line["key"] for line in data["keys"]] == [k(2), k(3)]

    bad = tmp_path / "bad.txt"
    bad.write_text(f"{k(2)}\n\ndigest:2026-W42:two words\n", encoding="utf-8")
    refused_changes_nothing(
        mixed, *replay_argv(P), "--keys-file", str(bad), says=[f"--keys-file {bad} line 3:"]
    )
    missing = tmp_path / "missing.txt"
    refused_changes_nothing(
        mixed, *replay_argv(P), "--keys-file", str(missing), says=["cannot read it", "No such file"]
    )
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe\x00")
    refused_changes_nothing(
        mixed, *replay_argv(P), "--keys-file", str(binary), says=["not UTF-8 text"]
    )


def test_the_replay_cap_refuses_101_keys_unless_max_keys_raises_it(world, tmp_path):
    count = 101
    keys = seed_period(world.ledger, count, now=world.clock.now())
    mailer = ScriptedMailer(OutboxMailer(world.outbox_dir))
    mailer.outage = PERMANENT
    world.deliver(mailer)
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text("".join(f"{key}\n" for key in keys), encoding="utf-8")
    argv = [*replay_argv(P), "--keys-file", str(keys_file)]

    refused_changes_nothing(world, *argv, says=["101 keys exceed the replay cap of 100"])
    refused_changes_nothing(world, *argv, "--max-keys", "50", says=["cap of 50"])
    data = world.cli(*argv, "--max-keys", "150", "--json").json()
    assert (data["cap"], data["replayed"]) == (150, count)
    counts = world.cli("status", "--period", P, "--json").json()["by_state"]
    assert counts == {"pending": count}
