"""`DIGEST_INSTANCE`: the commands work on the ledger of the instance the process is configured as.

A ledger records its instance the first time a command opens it, and every later command under
another name is refused in one line (exit 2) with nothing changed; a ledger that already holds
`digest`'s work refuses any other name. Under its own name a command sees the instance's keys.
"""

from sqlalchemy import select

from digest_pipeline.adapters.mail.outbox import OutboxMailer
from digest_pipeline.adapters.sql.schema import ledger_identity
from digest_pipeline.wiring import ledger_on
from digest_pipeline_tests.builders import seed_period
from digest_pipeline_tests.cli.conftest import World

P = "2026-W42"
VIP = {"DIGEST_INSTANCE": "vip_digest"}


def _refused_in_one_line(world: World, command: str, *argv: str, env: dict[str, str]) -> str:
    before = world.dump()
    run = world.cli(command, *argv, env=env)
    assert run.code == 2, run.err
    assert run.out == ""
    assert run.err.count("\n") == 1
    assert run.err.startswith(f"digest {command}: error: ")
    assert world.dump() == before
    return run.err


def test_a_ledger_of_digests_work_refuses_another_instance(mixed):
    line = _refused_in_one_line(mixed, "status", "--period", P, env=VIP)
    assert "belongs to digest instance digest, not vip_digest" in line


def test_the_first_command_records_its_instance_and_the_default_is_refused_after(world):
    assert world.cli("status", "--period", P, env=VIP).code == 0

    with world.engine.connect() as conn:
        assert conn.execute(select(ledger_identity.c.instance)).scalar_one() == "vip_digest"
    line = _refused_in_one_line(world, "items", "--period", P, env={})
    assert "belongs to digest instance vip_digest, not digest" in line


def test_an_instances_commands_show_its_own_keys(world):
    ledger = ledger_on(world.engine, "vip_digest", now=world.clock.now())
    keys = seed_period(ledger, 3, now=world.clock.now())
    world.deliver(OutboxMailer(world.outbox_dir))

    data = world.cli("items", "--period", P, "--json", env=VIP).json()

    assert sorted(i["key"] for i in data["items"]) == sorted(str(k) for k in keys)
    assert all(i["key"].startswith("vip_digest:2026-W42:") for i in data["items"])
    assert all(name.startswith("vip_digest_2026-W42_") for name in world.outbox_files())
