"""`Ledger.replace_digest_rows`, the same tests over the fake, SQLite and PostgreSQL.

Only never-sent items (pending, retry_scheduled, failed, dead_lettered) get new rows; any other
key, or a key without an item, is refused and keeps its rows; item states never change.
"""

import pytest

from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import Claim, CleanupMode, DigestRow, WriteDeadLetter
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.ports import Ledger
from digest_pipeline_tests.builders import (
    ROWS_PER_CUSTOMER,
    clean_one,
    digest_rows_for,
    key_of,
    rows_of,
    seed_period,
)
from digest_pipeline_tests.conftest import T0
from digest_pipeline_tests.contract.ledger_steps import LEASE, claim_one, send, time_out


def fresh(key: OperationKey, *titles: str) -> list[DigestRow]:
    return [
        DigestRow(key, n, {"title": t, "url": f"https://shop.example/new/{n}"})
        for n, t in enumerate(titles)
    ]


def all_claimed(ledger: Ledger) -> dict[OperationKey, Claim]:
    return {c.key: c for c in ledger.claim_due(T0, "w1", LEASE, 100)}


def titles(ledger: Ledger, key: OperationKey) -> list[object]:
    return [r.payload["title"] for r in rows_of(ledger, key)]


def test_rows_of_a_pending_item_are_replaced_and_its_state_stays(ledger):
    [k] = seed_period(ledger, 1)
    before = ledger.get(k)

    result = ledger.replace_digest_rows([k], fresh(k, "Teapot", "Kettle", "Mug"))

    assert result.replaced == {k}
    assert (result.refused, result.removed, result.written) == ({}, ROWS_PER_CUSTOMER, 3)
    assert titles(ledger, k) == ["Teapot", "Kettle", "Mug"]
    assert [r.position for r in rows_of(ledger, k)] == [0, 1, 2]
    assert ledger.get(k) == before


def fail(ledger: Ledger, claim: Claim) -> None:
    send(
        ledger,
        claim,
        SendOutcome.failed(FailureClass.PERMANENT, "render_error"),
        DeliveryState.FAILED,
        failure_class=FailureClass.PERMANENT,
        effects=(WriteDeadLetter("permanent"),),
    )


def test_every_never_sent_state_is_replaced(ledger):
    failed, dead, retrying, _ = seed_period(ledger, 4)
    claims = all_claimed(ledger)
    fail(ledger, claims[failed])
    transient = SendOutcome.failed(FailureClass.TRANSIENT, "smtp:421")
    fields = {"failure_class": FailureClass.TRANSIENT}
    send(
        ledger,
        claims[dead],
        transient,
        DeliveryState.DEAD_LETTERED,
        effects=(WriteDeadLetter("max_attempts"),),
        **fields,
    )
    send(
        ledger,
        claims[retrying],
        transient,
        DeliveryState.RETRY_SCHEDULED,
        next_attempt_at=T0 + LEASE,
        **fields,
    )
    keys = [failed, dead, retrying]
    states = {k: ledger.get(k).state for k in keys}

    result = ledger.replace_digest_rows(keys, [r for k in keys for r in fresh(k, "Teapot")])

    assert result.replaced == set(keys)
    assert all(titles(ledger, k) == ["Teapot"] for k in keys)
    assert states == {
        failed: DeliveryState.FAILED,
        dead: DeliveryState.DEAD_LETTERED,
        retrying: DeliveryState.RETRY_SCHEDULED,
    }
    assert {k: ledger.get(k).state for k in keys} == states


def test_claimed_sent_cleaned_and_unknown_items_keep_their_rows(ledger):
    claimed, sent, cleaned, unknown = seed_period(ledger, 4)
    claims = all_claimed(ledger)
    send(ledger, claims[sent], SendOutcome.sent("p-1"), DeliveryState.SENT)
    send(ledger, claims[cleaned], SendOutcome.sent("p-2"), DeliveryState.SENT)
    clean_one(ledger, cleaned, claims[cleaned].token, CleanupMode.DELETE, T0)
    time_out(ledger, claims[unknown])
    keys = [claimed, sent, cleaned, unknown]
    before = {k: rows_of(ledger, k) for k in keys}
    states = {k: ledger.get(k).state for k in keys}

    result = ledger.replace_digest_rows(keys, [r for k in keys for r in fresh(k, "Teapot")])

    assert result.replaced == frozenset()
    assert result.refused == {
        claimed: DeliveryState.CLAIMED,
        sent: DeliveryState.SENT,
        cleaned: DeliveryState.CLEANED,
        unknown: DeliveryState.UNKNOWN,
    }
    assert (result.removed, result.written) == (0, 0)
    assert {k: rows_of(ledger, k) for k in keys} == before
    assert {k: ledger.get(k).state for k in keys} == states
    assert claims[claimed].token == ledger.get(claimed).lease_token


def test_a_key_without_a_work_item_is_refused(ledger):
    [k] = seed_period(ledger, 1, enqueue=False)

    result = ledger.replace_digest_rows([k], fresh(k, "Teapot"))

    assert result.refused == {k: None}
    assert titles(ledger, k) == [r.payload["title"] for r in digest_rows_for(k, 1)]


def test_one_call_replaces_the_movable_keys_and_refuses_the_rest(ledger):
    failed, sent, other = seed_period(ledger, 3)
    claims = all_claimed(ledger)
    send(ledger, claims[sent], SendOutcome.sent("p-1"), DeliveryState.SENT)
    fail(ledger, claims[failed])

    result = ledger.replace_digest_rows(
        [failed, sent], [*fresh(failed, "Teapot"), *fresh(sent, "Kettle")]
    )

    assert result.replaced == {failed}
    assert result.refused == {sent: DeliveryState.SENT}
    assert (result.removed, result.written) == (ROWS_PER_CUSTOMER, 1)
    assert titles(ledger, failed) == ["Teapot"]
    assert titles(ledger, sent) == [r.payload["title"] for r in digest_rows_for(sent, 2)]
    assert titles(ledger, other) == [r.payload["title"] for r in digest_rows_for(other, 3)]


def test_a_key_may_get_no_new_rows(ledger):
    [k] = seed_period(ledger, 1)

    result = ledger.replace_digest_rows([k], [])

    assert (result.replaced, result.removed, result.written) == ({k}, ROWS_PER_CUSTOMER, 0)
    assert rows_of(ledger, k) == []
    assert k not in ledger.keys_with_rows_of([k])


def test_rows_of_a_key_not_named_are_refused_and_nothing_changes(ledger):
    first, second = seed_period(ledger, 2)
    before = [rows_of(ledger, first), rows_of(ledger, second)]

    with pytest.raises(ValueError, match="not being replaced"):
        ledger.replace_digest_rows([first], [*fresh(first, "Teapot"), *fresh(second, "Mug")])

    assert [rows_of(ledger, first), rows_of(ledger, second)] == before


def test_no_keys_is_a_no_op(ledger):
    seed_period(ledger, 1)

    result = ledger.replace_digest_rows([], [])

    assert (result.replaced, result.refused, result.removed, result.written) == (
        frozenset(),
        {},
        0,
        0,
    )


def test_an_item_claimed_after_the_replacement_renders_the_new_rows(ledger):
    [k] = seed_period(ledger, 1)
    ledger.replace_digest_rows([k], fresh(k, "Teapot"))

    claim = claim_one(ledger, k)

    assert claim.key == key_of(1)
    assert titles(ledger, k) == ["Teapot"]
