"""The snapshot gate from the terminal: `digest sweep` on a real ledger after the frozen snapshot
was edited in SQL sends nothing to the edited address, cleans nothing of the week, says so in one
`refused:` line and exits 1."""

import json

from sqlalchemy import text

from digest_pipeline.services.deliver import deliver_due
from digest_pipeline.services.link_secrets import require_secret
from digest_pipeline_tests.builders import key_of, make_deliverer, seed_period
from digest_pipeline_tests.cli.conftest import PRIVATE_SECRET, World
from digest_pipeline_tests.fakes import FakeMailer

TAMPERED = "tampered@example.com"


def tamper(world: World) -> None:
    """What a bad migration or a hand edit does: `UPDATE eligibility_snapshot SET recipient …`."""
    with world.engine.begin() as conn:
        conn.execute(text("UPDATE eligibility_snapshot SET recipient = :r"), {"r": TAMPERED})


def enqueued_and_one_sent(world: World) -> None:
    seed_period(world.ledger, 3, now=world.clock.now())
    deliverer = make_deliverer(world.ledger, FakeMailer(clock=world.clock), world.clock)
    deliver_due(deliverer, batch_size=1, concurrency=1, max_items=1)
    assert world.ledger.get(key_of(1)).state.value == "sent"  # type: ignore[union-attr]


def test_a_sweep_after_the_snapshot_was_edited_sends_nothing_cleans_nothing_and_exits_1(world):
    enqueued_and_one_sent(world)
    tamper(world)
    # the sweep records its secret's fingerprint on first use; its refusal of the week is the point
    require_secret(world.ledger, PRIVATE_SECRET, world.clock.now(), what="digest sweep")
    before = world.dump()

    run = world.cli("sweep")

    assert run.code == 1
    assert run.err.count("\n") == 1
    assert run.err.startswith("refused: period 2026-W42: its frozen eligibility snapshot")
    assert TAMPERED not in run.err + run.out
    assert world.outbox_files() == []  # nothing sent, to the edited address or any other
    assert world.dump() == before  # the sent item is not cleaned, the pending ones not claimed


def test_the_sweeps_json_names_the_refused_period(world):
    enqueued_and_one_sent(world)
    tamper(world)

    run = world.cli("sweep", "--json")

    assert run.code == 1
    data = json.loads(run.out)
    assert list(data["refused"]) == ["2026-W42"]
    assert data["periods"] == []
    assert data["delivered"]["claimed"] == 0
    assert data["cleaned"] == {}


def test_an_untouched_snapshot_is_swept_as_before(world):
    enqueued_and_one_sent(world)

    run = world.cli("sweep")

    assert run.code == 0, run.err
    assert sorted(world.outbox_files()) == [
        "digest_2026-W42_customer-0002.eml",
        "digest_2026-W42_customer-0003.eml",
    ]
