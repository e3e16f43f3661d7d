"""The batch forms of the ledger (one transaction per wave or page), over every ledger.

Each batch call must mean exactly what the single calls in a loop mean: the same tickets,
the same states, the same errors for the items that cannot move, in the caller's order.
"""

from dataclasses import replace
from datetime import timedelta

import pytest
from sqlalchemy import insert
from sqlalchemy.exc import IntegrityError

from digest_pipeline.adapters.sql.schema import cleanups
from digest_pipeline.domain.errors import LostRace, UnknownWorkItem
from digest_pipeline.domain.failures import FailureClass, SendOutcome
from digest_pipeline.domain.model import (
    AttemptTicket,
    AuditNote,
    CleanupMode,
    CleanupReceipt,
    DigestRow,
    ItemLease,
    ItemTimes,
    RefundBudget,
    Transition,
    WriteDeadLetter,
)
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline_tests.builders import TEST_MAILER, clean_one, recipient_of, rows_of
from digest_pipeline_tests.conftest import T0, W42
from digest_pipeline_tests.contract.ledger_steps import LEASE, W43, frozen, key, send


def test_start_attempts_gives_tickets_in_order_and_errors_for_what_cannot_start(ledger):
    a, b, c = frozen(ledger, 3)
    claims = {cl.key: cl for cl in ledger.claim_due(T0, "w1", LEASE, 10)}
    ledger.recover_expired_leases(T0 + LEASE)  # every lease ran out ...
    fresh = {cl.key: cl for cl in ledger.claim_due(T0 + LEASE, "w2", LEASE, 10, W42)}
    # a claim of a key the ledger has never seen
    ghost = replace(claims[a], item=replace(claims[a].item, key=key("customer-404")))

    now = T0 + LEASE + timedelta(seconds=1)
    started = ledger.start_attempts([fresh[b], claims[a], ghost, fresh[c]], now, mailer=TEST_MAILER)

    assert [type(s) for s in started] == [AttemptTicket, LostRace, UnknownWorkItem, AttemptTicket]
    first, _, _, last = started
    assert isinstance(first, AttemptTicket)
    assert isinstance(last, AttemptTicket)
    assert (first.key, first.number, first.token) == (b, 1, fresh[b].token)
    assert (last.key, last.number, last.token) == (c, 1, fresh[c].token)
    assert [x.number for x in ledger.attempts(b)] == [1]
    assert ledger.attempts(a) == []  # the stale claim started nothing


def test_complete_many_after_the_sweep_took_every_lease_closes_every_attempt(ledger):
    a, b, c = frozen(ledger, 3)
    claims = {cl.key: cl for cl in ledger.claim_due(T0, "w1", LEASE, 10)}
    tickets = ledger.start_attempts([claims[k] for k in (a, b, c)], T0, mailer=TEST_MAILER)
    ledger.recover_expired_leases(T0 + LEASE)  # the outcomes came back too late
    outcomes = [
        SendOutcome.sent("pm-a"),
        SendOutcome.failed(FailureClass.TRANSIENT, "451"),
        SendOutcome.failed(FailureClass.PERMANENT, "550"),
    ]
    targets = [DeliveryState.SENT, DeliveryState.RETRY_SCHEDULED, DeliveryState.FAILED]
    results = []
    for k, t, o, target in zip((a, b, c), tickets, outcomes, targets, strict=True):
        assert isinstance(t, AttemptTicket)
        results.append(
            (t, o, Transition(k, DeliveryState.CLAIMED, claims[k].token, target, T0 + LEASE))
        )

    errors = ledger.complete_many(results)

    assert all(isinstance(e, LostRace) for e in errors)
    assert {i.state for i in ledger.items(W42)} == {DeliveryState.UNKNOWN}
    # every attempt is closed with its outcome anyway: evidence for reconciliation
    assert [ledger.attempts(k)[-1].outcome for k in (a, b, c)] == [
        "sent",
        "transient",
        "permanent",
    ]


def test_complete_many_mixes_applied_and_lost_transitions_in_order(ledger):
    a, b, c = frozen(ledger, 3)
    claims = {cl.key: cl for cl in ledger.claim_due(T0, "w1", LEASE, 10)}
    ta, tb, tc = ledger.start_attempts([claims[a], claims[b], claims[c]], T0, mailer=TEST_MAILER)
    assert isinstance(ta, AttemptTicket)
    assert isinstance(tb, AttemptTicket)
    assert isinstance(tc, AttemptTicket)
    later = T0 + timedelta(seconds=5)
    stale = claims[b].token + 1  # b's outcome carries a token the item never had

    errors = ledger.complete_many(
        [
            (
                ta,
                SendOutcome.sent("pm-a"),
                Transition(
                    a,
                    DeliveryState.CLAIMED,
                    claims[a].token,
                    DeliveryState.SENT,
                    later,
                    provider_message_id="pm-a",
                ),
            ),
            (
                tb,
                SendOutcome.sent("pm-b"),
                Transition(b, DeliveryState.CLAIMED, stale, DeliveryState.SENT, later),
            ),
            (
                tc,
                SendOutcome.failed(FailureClass.THROTTLED, "429"),
                Transition(
                    c,
                    DeliveryState.CLAIMED,
                    claims[c].token,
                    DeliveryState.DEAD_LETTERED,
                    later,
                    failure_class=FailureClass.THROTTLED,
                    effects=(RefundBudget(), WriteDeadLetter("max_age")),
                    audit=AuditNote("system:test", "deliver", "max_age"),
                ),
            ),
        ]
    )

    assert [type(e) for e in errors] == [type(None), LostRace, type(None)]
    items = {i.key: i for i in ledger.items(W42)}
    assert (items[a].state, items[a].provider_message_id, items[a].sent_at) == (
        DeliveryState.SENT,
        "pm-a",
        later,
    )
    assert items[b].state is DeliveryState.CLAIMED  # untouched
    assert ledger.attempts(b)[-1].outcome == "sent"  # but its attempt is closed: evidence
    assert (items[c].state, items[c].budget_used) == (DeliveryState.DEAD_LETTERED, 0)  # refunded
    [dead] = ledger.dead_letters(W42)
    assert (dead.key, dead.reason, dead.attempts, dead.last_failure_class) == (
        c,
        "max_age",
        1,
        FailureClass.THROTTLED,
    )
    # the item's counters as the wave's updates left them, and the transition's own time
    assert (dead.first_attempt_at, dead.last_attempt_at, dead.created_at) == (
        items[c].first_attempt_at,
        items[c].last_attempt_at,
        later,
    )
    assert dead.first_attempt_at is not None
    assert [(e.key, e.action, e.reason) for e in ledger.audit_log(W42)] == [
        (c, "deliver", "max_age")
    ]


def sent_items(ledger, n: int):
    keys = frozen(ledger, n)
    claims = {cl.key: cl for cl in ledger.claim_due(T0, "w1", LEASE, 100)}
    tickets = ledger.start_attempts([claims[k] for k in keys], T0, mailer=TEST_MAILER)
    ledger.complete_many(
        [
            (
                t,
                SendOutcome.sent(f"pm-{i}"),
                Transition(k, DeliveryState.CLAIMED, claims[k].token, DeliveryState.SENT, T0),
            )
            for i, (k, t) in enumerate(zip(keys, tickets, strict=True))
        ]
    )
    for i, k in enumerate(keys):
        ledger.add_digest_rows([DigestRow(k, p, {"title": f"t{i}{p}"}) for p in range(i + 1)])
    return keys, claims


@pytest.mark.parametrize("mode", list(CleanupMode))
def test_clean_many_cleans_sent_items_once_and_refuses_the_rest_without_change(ledger, mode):
    (a, b, c), claims = sent_items(ledger, 3)
    clean_one(ledger, a, claims[a].token, mode, T0)  # a was cleaned by an earlier run
    d = frozen(ledger, 1, W43)[0]  # d is pending: not sent

    out = ledger.clean_many(
        [
            (a, claims[a].token),
            (b, claims[b].token),
            (c, claims[c].token + 7),
            (d, 0),
            (key("customer-404"), 1),
        ],
        mode,
        T0 + timedelta(minutes=1),
    )

    assert out[0] == CleanupReceipt(a, "already_cleaned", 0)
    assert out[1] == CleanupReceipt(b, "cleaned", 2)  # b had two rows
    assert [type(x) for x in out[2:]] == [LostRace, LostRace, UnknownWorkItem]
    states = {i.key: i.state for i in ledger.items(W42)}
    assert states == {a: DeliveryState.CLEANED, b: DeliveryState.CLEANED, c: DeliveryState.SENT}
    assert rows_of(ledger, b) == []
    assert len(rows_of(ledger, c)) == 3  # refused: its rows stay
    assert {i.key: i.state for i in ledger.items(W43)} == {d: DeliveryState.PENDING}
    assert ledger.keys_with_rows(W42) == {c}
    assert all(r.passed for r in ledger.check_invariants(W42, T0 + timedelta(minutes=1)))


def test_recipients_and_rows_of_many_keys(ledger):
    (a, b, c), _ = sent_items(ledger, 3)
    missing = key("customer-404")

    assert ledger.recipients([a, b, missing]) == {
        a: recipient_of(ledger, a),
        b: recipient_of(ledger, b),
    }
    rows = ledger.digest_rows_of([c, a, missing])
    assert rows == {c: rows_of(ledger, c), a: rows_of(ledger, a), missing: []}
    assert [r.position for r in rows[c]] == [0, 1, 2]
    assert ledger.keys_with_rows_of([c, a, missing]) == {c, a}


@pytest.mark.parametrize("page", [1, 2, 1_000])
def test_iter_needing_content_names_the_frozen_customers_without_rows_or_a_delivery(ledger, page):
    a, sent, cleaned, with_rows, failed, f = frozen(ledger, 6)
    frozen(ledger, 2, W43)  # another week's customers are never this week's
    claims = {cl.key: cl for cl in ledger.claim_due(T0, "w1", LEASE, 100, W42)}
    send(ledger, claims[sent], SendOutcome.sent("pm-1"), DeliveryState.SENT)
    send(ledger, claims[cleaned], SendOutcome.sent("pm-2"), DeliveryState.SENT)
    ledger.add_digest_rows([DigestRow(cleaned, 0, {"title": "t"})])
    clean_one(ledger, cleaned, claims[cleaned].token, CleanupMode.DELETE, T0)
    ledger.add_digest_rows([DigestRow(with_rows, 0, {"title": "t"})])
    failure = SendOutcome.failed(FailureClass.PERMANENT, "550")
    send(ledger, claims[failed], failure, DeliveryState.FAILED)

    seen = []
    for customer_id in ledger.iter_needing_content(W42, page=page):
        seen.append(customer_id)
        # written as content generation writes them, while the pages are being read
        ledger.add_digest_rows([DigestRow(key(customer_id), 0, {"title": "t"})])

    # a failed item without rows gets them back (a replay sends it); the delivered never do
    assert seen == [k.customer_id for k in (a, failed, f)]
    assert list(ledger.iter_needing_content(W42, page=page)) == []
    assert list(ledger.iter_needing_content(W43, page=page)) == ["customer-0", "customer-1"]


@pytest.mark.parametrize("page", [1, 2, 7, 1_000])
def test_iter_items_yields_every_item_once_whatever_the_page(ledger, page):
    keys = frozen(ledger, 7)
    claims = ledger.claim_due(T0, "w1", LEASE, 3)

    streamed = list(ledger.iter_items(W42, page=page))
    claimed = list(ledger.iter_items(W42, [DeliveryState.CLAIMED], page=page))

    assert sorted(str(i.key) for i in streamed) == sorted(str(k) for k in keys)
    assert sorted(str(i.key) for i in claimed) == sorted(str(c.key) for c in claims)


def test_item_times_are_the_items_state_and_times_each_once(ledger):
    # the metrics' pass reads five columns, never a different story from the whole rows
    sent_items(ledger, 3)
    frozen(ledger, 2, W43)  # another week's items are not this week's
    ledger.claim_due(T0 + timedelta(minutes=1), "w2", LEASE, 1)

    times = list(ledger.iter_item_times(W42))

    assert sorted(times, key=repr) == sorted((ItemTimes.of(i) for i in ledger.items(W42)), key=repr)
    assert len(times) == 3
    assert all(t.state is DeliveryState.SENT and t.sent_at is not None for t in times)
    assert all(t.first_claimed_at is not None for t in times)


@pytest.mark.parametrize("page", [1, 2, 1_000])
def test_item_leases_are_the_items_keys_states_and_tokens_each_once_in_key_order(ledger, page):
    # cleanup reads these columns only, never a different story from the whole rows
    (a, b, c), claims = sent_items(ledger, 3)
    frozen(ledger, 2, W43)  # another week's items are not this week's
    clean_one(ledger, a, claims[a].token, CleanupMode.DELETE, T0)
    ledger.recover_expired_leases(T0 + LEASE)  # tokens of unclaimed items stay where they were

    leases = list(ledger.iter_item_leases(W42, page=page))

    assert leases == [ItemLease.of(i) for i in ledger.items(W42)]
    assert [x.key for x in leases] == sorted([a, b, c], key=str)
    assert [x.state for x in leases] == [
        DeliveryState.CLEANED,
        DeliveryState.SENT,
        DeliveryState.SENT,
    ]
    assert [x.lease_token for x in leases] == [claims[k].token for k in (a, b, c)]


def test_a_cleanup_row_beside_a_sent_item_fails_its_chunk_and_nothing_of_it_commits(sql_ledger):
    # an item is `cleaned` exactly when its cleanup row exists; a row left by a hand edit must
    # stop the cleanup loudly, never let it report the item done or move its neighbours
    a, b = frozen(sql_ledger, 2)
    sql_ledger.add_digest_rows([DigestRow(a, 0, {"title": "x"}), DigestRow(b, 0, {"title": "y"})])
    claims = {cl.key: cl for cl in sql_ledger.claim_due(T0, "w1", LEASE, 10)}
    for k in (a, b):
        send(sql_ledger, claims[k], SendOutcome.sent("pm"), DeliveryState.SENT)
    stray = {"period": str(W42), "mode": "archive", "rows": 0, "claimed_at": T0, "completed_at": T0}
    with sql_ledger.engine.begin() as conn:
        conn.execute(insert(cleanups).values(operation_key=str(a), **stray))

    with pytest.raises(IntegrityError):
        sql_ledger.clean_many([(k, claims[k].token) for k in (a, b)], CleanupMode.DELETE, T0)

    assert {i.key: i.state for i in sql_ledger.items(W42)} == {
        a: DeliveryState.SENT,
        b: DeliveryState.SENT,
    }
    assert (len(rows_of(sql_ledger, a)), len(rows_of(sql_ledger, b))) == (1, 1)
