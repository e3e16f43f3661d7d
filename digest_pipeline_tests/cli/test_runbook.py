"""The runbook (docs/how-to/runbook.md), one test per scenario, written as the operator acts at the terminal.

What happened before the operator looks (the delivery runs, the outage) is arranged with the
services and injected faults; everything after is `digest …` against the same ledger. Each test
ends on the ledger's final state, the provider's own count per key, and design §4's invariants.
"""

import json
import re
from datetime import datetime, timedelta

from digest_pipeline.adapters.mail.outbox import OutboxMailer
from digest_pipeline.adapters.mail.smtp import SmtpMailer
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.policy import DeliveryPolicy
from digest_pipeline.services.pipeline import sweep
from digest_pipeline.services.reconcile import reconcile_period
from digest_pipeline_tests.builders import key_of, make_deliverer, seed_period
from digest_pipeline_tests.cli.conftest import PERMANENT, TRANSIENT, ScriptedMailer, World
from digest_pipeline_tests.conftest import W42
from digest_pipeline_tests.fakes import FakeMailer, FaultInjectingMailer
from digest_pipeline_tests.smtp_peer import (
    SmtpPeer,
    smtp_peer_fixture,  # noqa: F401  (provides the `smtp_peer` fixture)
)

P = "2026-W42"


def k(n: int) -> str:
    return str(key_of(n))


def smtp_env(peer: SmtpPeer) -> dict[str, str]:
    """`digest` configured for the loopback relay: it cannot look keys up, nor deduplicate."""
    return {
        "DIGEST_MAILER": "smtp",
        "DIGEST_SMTP_HOST": peer.host,
        "DIGEST_SMTP_PORT": str(peer.port),
        "DIGEST_SMTP_SECURITY": "none",
        "DIGEST_SMTP_TIMEOUT_SECONDS": "5",
    }


def assert_invariants_hold(world: World) -> None:
    status = world.cli("status", "--period", P, "--json")
    assert status.code == 0, status.out
    failing = [n for n, r in status.json()["invariants"].items() if not r["passed"]]
    assert failing == []


def states(world: World) -> dict[str, str]:
    items = world.cli("items", "--period", P, "--json").json()["items"]
    return {i["key"]: i["state"] for i in items}


def test_a_customer_says_they_got_two_digests(world):
    # Before: customer 3's send timed out after the provider accepted it; the sensor's sweep
    # resent it under the same key and the provider suppressed the repeat.
    seed_period(world.ledger, 5, now=world.clock.now())
    provider = FakeMailer(can_lookup=False, clock=world.clock)
    provider.script_timeout_after_accept(key_of(3))
    world.deliver(provider)
    world.clock.advance(timedelta(minutes=5))
    sweep(make_deliverer(world.ledger, provider, world.clock), batch_size=50, concurrency=1)

    story = world.cli("items", "--period", P, "--key", k(3), "--json").json()
    assert story["item"]["state"] == "cleaned"
    attempts = [(a["outcome"], a["detail"], a["duplicate"]) for a in story["attempts"]]
    assert attempts == [
        ("unknown", "timeout_after_send", False),  # accepted, but the worker never heard
        ("sent", "accepted", True),  # the resend: the provider recognised the key
    ]
    assert [r["reason"] for r in story["audit"]] == ["evidence:idempotent_resend"]
    text = world.cli("items", "--period", P, "--key", k(3)).out
    assert "attempts: 2" in text

    status_text = world.cli("status", "--period", P).out
    assert re.search(r"no_duplicate_send +pass +0", status_text)
    status = world.cli("status", "--period", P, "--json").json()
    assert status["invariants"]["no_duplicate_send"]["passed"]
    assert (status["metrics"]["duplicate_sends"], status["metrics"]["duplicates_suppressed"]) == (
        0,
        1,
    )
    assert_invariants_hold(world)
    assert provider.deliveries_for(key_of(3)) == 1  # the customer got one digest


def test_a_period_has_unknowns(world, smtp_peer):
    # Before: two sends ended `unknown` at the relay; it stored customer 2's, not customer 3's.
    seed_period(world.ledger, 4, now=world.clock.now())
    relay = SmtpMailer(smtp_peer.settings())
    faults = FaultInjectingMailer(relay)
    mailer = ScriptedMailer(faults)
    faults.timeout_after_accept(key_of(2))
    mailer.script(key_of(3), SendOutcome.failed(FailureClass.UNKNOWN, "smtp:timeout_after_data"))
    world.deliver(mailer)
    relay.close()
    env = smtp_env(smtp_peer)

    unknown = world.cli("items", "--period", P, "--state", "unknown", "--json").json()
    assert [i["key"] for i in unknown["items"]] == [k(2), k(3)]

    reconciled = world.cli("reconcile", "--period", P, env=env)
    assert reconciled.code == 0
    assert "2 items have no evidence either way" in reconciled.out
    assert "digest resolve --key K --as sent|not-sent" in reconciled.out
    assert states(world)[k(2)] == states(world)[k(3)] == "unknown"

    # the relay's log (here: what the peer stored) is the operator's evidence
    assert (smtp_peer.delivered_count(k(2)), smtp_peer.delivered_count(k(3))) == (1, 0)
    sent = ["--as", "sent", "--reason", "relay log: 250 queued", "--operator", "alice"]
    assert world.cli("resolve", "--key", k(2), *sent).code == 0
    not_sent = ["--as", "not-sent", "--reason", "not in the relay log", "--operator", "alice"]
    resolved = world.cli("resolve", "--key", k(3), *not_sent)
    assert "resends it with the same operation key" in resolved.out

    swept = world.cli("sweep", "--json", env=env).json()
    assert swept["delivered"] == {"claimed": 1, "by_state": {"sent": 1}, "lost_races": 0}
    assert set(states(world).values()) == {"cleaned"}
    assert [smtp_peer.delivered_count(k(n)) for n in range(1, 5)] == [1, 1, 1, 1]
    audit = world.cli("audit", "--period", P, "--json").json()["audit"]
    assert [(r["actor"], r["key"], r["to_state"]) for r in audit] == [
        ("alice", k(2), "sent"),
        ("alice", k(3), "retry_scheduled"),
    ]
    assert_invariants_hold(world)


def test_the_provider_was_down_for_an_hour(world, smtp_peer):
    # Before: every send failed with 421 for an hour; the sensor tried every 15 minutes.
    count = 5
    seed_period(world.ledger, count, now=world.clock.now())
    relay = SmtpMailer(smtp_peer.settings())
    mailer = ScriptedMailer(relay)
    mailer.outage = TRANSIENT
    start = world.clock.now()
    for minutes in (0, 15, 30, 45):
        world.clock.set(start + timedelta(minutes=minutes))
        world.deliver(mailer, policy=DeliveryPolicy())  # the configured (default) policy
    relay.close()
    env = smtp_env(smtp_peer)

    status = world.cli("status", "--period", P, "--json").json()
    assert status["by_state"] == {"retry_scheduled": count}
    assert status["invariants"]["every_customer_has_visible_state"]["passed"]
    waiting = world.cli("items", "--period", P, "--state", "retry_scheduled", "--json").json()
    assert {i["attempts"] for i in waiting["items"]} == {4}
    assert {i["last_detail"] for i in waiting["items"]} == {"smtp:421"}

    # the relay is back, but the backoff has not run out yet: nothing is sent early
    early = world.cli("sweep", "--json", env=env).json()
    assert early["delivered"]["claimed"] == 0
    due = max(datetime.fromisoformat(i["next_attempt_at"]) for i in waiting["items"])
    world.clock.set(due)
    swept = world.cli("sweep", "--json", env=env).json()
    assert swept["delivered"] == {"claimed": count, "by_state": {"sent": count}, "lost_races": 0}

    assert set(states(world).values()) == {"cleaned"}
    assert [smtp_peer.delivered_count(k(n)) for n in range(1, count + 1)] == [1] * count
    assert world.cli("dead-letters", "--period", P, "--json").json()["dead_letters"] == []
    assert_invariants_hold(world)


def test_replay_these_five_keys(world, tmp_path):
    # Before: three mailboxes refused the digest (550) and two sends ran out of retries.
    seed_period(world.ledger, 7, now=world.clock.now())
    mailer = ScriptedMailer(OutboxMailer(world.outbox_dir))
    for n in (1, 2, 3):
        mailer.script(key_of(n), PERMANENT)
    for n in (4, 5):
        mailer.script(key_of(n), TRANSIENT, TRANSIENT)
    world.deliver(mailer)
    world.clock.advance(timedelta(minutes=1))
    world.deliver(mailer)

    letters = world.cli("dead-letters", "--period", P, "--json").json()["dead_letters"]
    keys = [d["key"] for d in letters]
    assert sorted(keys) == [k(n) for n in range(1, 6)]
    keys_file = tmp_path / "ops-9.keys"
    keys_file.write_text("# OPS-9: mailboxes fixed\n" + "\n".join(keys) + "\n", encoding="utf-8")
    replay = ["replay", "--period", P, "--keys-file", str(keys_file), "--operator", "alice"]
    replay += ["--reason", "OPS-9 mailboxes fixed"]

    before, files = world.dump(), world.outbox_files()
    plan = world.cli(*replay, "--dry-run", "--json").json()
    assert [(x["key"], x["plan"]) for x in plan["keys"]] == [(key, "replay") for key in keys]
    assert (world.dump(), world.outbox_files()) == (before, files)

    done = world.cli(*replay)
    assert done.code == 0
    assert "replayed 5 of 5 keys" in done.out
    swept = world.cli("sweep", "--json").json()
    assert swept["delivered"] == {"claimed": 5, "by_state": {"sent": 5}, "lost_races": 0}

    audit = world.cli("audit", "--period", P, "--json").json()["audit"]
    assert sorted((r["actor"], r["action"], r["key"]) for r in audit) == [
        ("alice", "replay", key) for key in sorted(keys)
    ]
    assert {r["reason"] for r in audit} == {"OPS-9 mailboxes fixed (mailer_lookup_not_found)"}
    assert set(states(world).values()) == {"cleaned"}
    assert len(world.outbox_files()) == 7  # one message per key, the five replayed included
    replayed = world.cli("dead-letters", "--period", P, "--json").json()["dead_letters"]
    assert all(d["replayed_at"] is not None for d in replayed)
    assert_invariants_hold(world)


def test_a_replay_is_refused_because_the_key_may_already_have_been_delivered(world):
    # Before: the provider accepted customer 1's digest but the worker timed out; the resend
    # under the same key, inside the provider's 24 h window, got a 409, so the key was
    # dead-lettered `unknown_unresolved`. A day later the customer says nothing arrived.
    seed_period(world.ledger, 1, now=world.clock.now())
    provider = FakeMailer(can_lookup=False, clock=world.clock)
    conflict = SendOutcome.failed(FailureClass.PERMANENT, "http:409:invalid_idempotent_request")
    provider.script(key_of(1), FakeMailer.ACCEPTED_THEN_TIMEOUT, conflict)
    world.deliver(provider, policy=DeliveryPolicy())
    world.clock.advance(timedelta(minutes=1))
    reconcile_period(world.ledger, provider, world.clock, DeliveryPolicy(), W42)
    world.deliver(provider, policy=DeliveryPolicy())  # the idempotent resend: 409
    world.clock.advance(timedelta(days=1))  # past the provider's deduplication window
    env = {  # a mailer that cannot look keys up (replay never sends, so nothing is dialled)
        "DIGEST_MAILER": "smtp",
        "DIGEST_SMTP_HOST": "127.0.0.1",
        "DIGEST_SMTP_PORT": "9",
        "DIGEST_SMTP_SECURITY": "none",
    }

    [letter] = world.cli("dead-letters", "--period", P, "--json").json()["dead_letters"]
    assert (letter["key"], letter["reason"]) == (k(1), "unknown_unresolved")
    replay = ["replay", "--period", P, "--key", k(1)]  # the OS user acts
    replay += ["--reason", "OPS-12 customer says nothing arrived"]

    # 1. the dry run names the attempt that may have delivered it
    before = world.dump()
    plan = world.cli(*replay, "--dry-run", "--json", env=env).json()
    [line] = plan["keys"]
    # the attempt went through the provider: SMTP's lookup would say nothing about it anyway
    assert (line["plan"], line["evidence"]) == ("possible_duplicate", "needs_mailer:FakeMailer")
    assert line["possible_send"] == {
        "attempt": 1,
        "outcome": "unknown",
        "started_at": "2026-10-19T06:00:00+00:00",
        "detail": "timeout_after_send",
        "provider_message_id": None,
    }
    assert plan["possible_duplicates"] == [k(1)]
    text = world.cli(*replay, "--dry-run", env=env).out
    assert "attempt 1 unknown (timeout_after_send) at 2026-10-19T06:00:00+00:00" in text
    assert "without --accept-possible-duplicate the replay is refused" in text

    # 2. without the acknowledgement: refused, one line, exit 2, nothing changed
    refused = world.cli(*replay, env=env)
    assert (refused.code, refused.out) == (2, "")
    assert refused.err.count("\n") == 1
    assert refused.err.startswith("digest replay: error: replay refused, nothing changed")
    assert k(1) in refused.err
    assert "--accept-possible-duplicate" in refused.err
    assert world.dump() == before

    # 3. the operator accepts a possible second copy; the audit row says so
    done = world.cli(*replay, "--accept-possible-duplicate", env=env)
    assert done.code == 0, done.err
    assert "replayed 1 of 1 keys" in done.out
    assert "1 possible duplicate(s) accepted by " in done.out
    audit = world.cli("audit", "--period", P, "--json").json()["audit"]
    assert (audit[-1]["key"], audit[-1]["action"]) == (k(1), "replay_possible_duplicate")
    assert "operator accepted a possible duplicate" in audit[-1]["reason"]

    # 4. the sweep delivers it again; the counters say one possible duplicate
    world.deliver(provider, policy=DeliveryPolicy())
    assert provider.deliveries_for(key_of(1)) == 2
    status = world.cli("status", "--period", P, "--json")
    assert status.code == 1
    data = json.loads(status.out)
    assert data["invariants"]["no_duplicate_send"] == {
        "passed": False,
        "violations": 1,
        "sample": [k(1)],
    }
    assert data["metrics"]["duplicate_sends"] == 1
