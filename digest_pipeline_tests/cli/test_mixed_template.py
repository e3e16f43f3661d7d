"""`mixed` on SQLite is one delivery per session, copied into each test (cli/conftest.py): the
copy must be exactly what a fresh `populate_mixed` leaves, or the tests that start from it would
no longer test what they say."""

import pytest

from digest_pipeline.adapters.mail.outbox import OutboxMailer
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline_tests.cli.conftest import (
    DEAD,
    FAILED,
    SENT,
    UNKNOWN,
    World,
    make_world,
    populate_mixed,
)
from digest_pipeline_tests.conftest import T0, W42
from digest_pipeline_tests.fakes import FixedClock


def messages(world: World) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in OutboxMailer(world.outbox_dir).stored()}


def ledger_rows(world: World) -> dict[str, list[tuple[object, ...]]]:
    """`world.dump()`, each attempt's mailer checked to be the world's own outbox, then left out.

    Two outboxes are two mailers (each Maildir has its own id), so only the copy's attempts
    and a fresh run's differ there, and each must name its own outbox.
    """
    rows = world.dump()
    assert {a[-1] for a in rows["attempts"]} == {OutboxMailer(world.outbox_dir).identity}
    rows["attempts"] = [a[:-1] for a in rows["attempts"]]
    return rows


@pytest.mark.parametrize("backend", ["sqlite"])
def test_a_copy_of_the_mixed_template_is_what_a_fresh_populate_mixed_leaves(
    mixed, sql_engine_factory, tmp_path, monkeypatch
):
    fresh = make_world(
        sql_engine_factory("sqlite"), FixedClock(T0), tmp_path / "fresh-outbox", monkeypatch
    )
    populate_mixed(fresh)

    assert mixed.engine.url.database == str(tmp_path / "ledger.db")  # this test's own copy
    assert ledger_rows(mixed) == ledger_rows(fresh)
    assert messages(mixed) == messages(fresh)
    assert mixed.clock.now() == fresh.clock.now()
    # not vacuous: every state `mixed` promises is there, and the messages the outbox accepted
    assert mixed.ledger.state_counts(W42) == {
        DeliveryState.SENT: len(SENT),
        DeliveryState.FAILED: len(FAILED),
        DeliveryState.DEAD_LETTERED: len(DEAD),
        DeliveryState.UNKNOWN: len(UNKNOWN),
    }
    assert len(messages(mixed)) == len(SENT) + len(UNKNOWN)
