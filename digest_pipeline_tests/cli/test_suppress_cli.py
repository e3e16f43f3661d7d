"""`digest suppress`, `digest unsuppress` and `digest suppressions` on a real ledger (SQLite, PostgreSQL).

An operator's suppression is audited, cancels the customer's unclaimed item, is idempotent and
changes nothing when refused; unsuppressing lets the next week select them again.
"""

import pytest

from digest_pipeline.domain.states import DeliveryState
from digest_pipeline_tests.builders import key_of, seed_period
from digest_pipeline_tests.cli.conftest import OS_USER, World
from digest_pipeline_tests.cli.operator_steps import refused_changes_nothing

CUSTOMER = key_of(2).customer_id


def _argv(command: str, customer: str = CUSTOMER, reason: str = "ticket OPS-12") -> list[str]:
    return [command, "--customer", customer, "--reason", reason, "--operator", OS_USER]


def test_suppress_cancels_the_unclaimed_item_is_audited_and_idempotent(world: World):
    seed_period(world.ledger, 3, now=world.clock.now())

    first = world.cli(*_argv("suppress"), "--json")
    again = world.cli(*_argv("suppress", reason="asked twice"))

    assert first.code == 0, first
    data = first.json()
    assert (data["changed"], data["suppression"]["reason"]) == (True, "operator")
    assert data["suppression"]["source"] == f"operator:{OS_USER}"
    assert again.code == 0, again
    assert "already suppressed (operator" in again.out
    states = {i.key: i.state for i in world.ledger.items(key_of(1).period)}
    assert states[key_of(2)] is DeliveryState.SUPPRESSED
    assert {states[key_of(1)], states[key_of(3)]} == {DeliveryState.PENDING}
    listed = [(e.action, e.actor, e.reason) for e in world.ledger.audit_log() if e.key is None]
    assert listed == [("suppress", f"operator:{OS_USER}", f"{CUSTOMER}: operator: ticket OPS-12")]
    assert world.cli("suppressions", "--json").json() == [data["suppression"]]


def test_unsuppress_is_audited_and_says_when_there_was_nothing_to_undo(world: World):
    seed_period(world.ledger, 3, now=world.clock.now())
    world.cli(*_argv("suppress"))

    undone = world.cli(*_argv("unsuppress", reason="wrong customer"))
    nothing = world.cli(*_argv("unsuppress"))

    assert undone.code == 0
    assert f"{CUSTOMER}: unsuppressed by {OS_USER}" in undone.out
    assert nothing.code == 0
    assert "not suppressed; nothing changed" in nothing.out
    assert world.cli("suppressions").out.strip() == "no suppressed customers"
    last = world.ledger.audit_log()[-1]
    assert (last.action, last.actor, last.reason) == (
        "unsuppress",
        OS_USER,
        f"{CUSTOMER}: wrong customer",
    )
    # the cancelled item stays cancelled: its week's meaning is fixed
    assert world.ledger.get(key_of(2)).state is DeliveryState.SUPPRESSED  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (_argv("suppress", customer="customer-9999"), ["no customer customer-9999"]),
        (_argv("suppress", customer="bad id!"), ["customer id"]),
        (_argv("suppress", reason="  "), ["--reason"]),
        (_argv("unsuppress", customer="customer-9999"), ["no customer customer-9999"]),
        (_argv("suppress", reason="two\nlines"), ["--reason"]),
    ],
    ids=["unknown", "invalid-id", "blank-reason", "unsuppress-unknown", "control-characters"],
)
def test_a_refused_request_is_one_line_and_changes_nothing(world: World, argv, says):
    seed_period(world.ledger, 3, now=world.clock.now())
    refused_changes_nothing(world, argv[0], *argv[1:], says=says)
