"""`domain.transitions.apply` is what the SQL ledger stores: one property over every legal move.

Each example writes an arbitrary work item straight into the table, applies an arbitrary guarded
transition through `SqlLedger.apply` and reads the row back: it must equal `apply(item, t)`, or
both must refuse the move and leave the row as it was. The fake ledger calls `apply` itself.
"""

import itertools
from dataclasses import fields
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import insert

from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.adapters.sql.schema import work_items
from digest_pipeline.domain.errors import LostRace
from digest_pipeline.domain.failures import FailureClass
from digest_pipeline.domain.model import (
    AuditNote,
    ClearDedupe,
    Effect,
    RefundBudget,
    Reopen,
    ResendUntil,
    Transition,
    WorkItem,
    WriteDeadLetter,
)
from digest_pipeline.domain.states import ALLOWED_TRANSITIONS, DeliveryState
from digest_pipeline.domain.transitions import apply
from digest_pipeline_tests.builders import key_of
from digest_pipeline_tests.conftest import T0

#: a fresh key per example: the ledger outlives the examples of one test
_keys = itertools.count(1)
#: claims are made by `claim_due`, never by a transition
MOVES = sorted((a, b) for a, b in ALLOWED_TRANSITIONS if b is not DeliveryState.CLAIMED)
seconds = st.integers(min_value=-10 * 86_400, max_value=10 * 86_400)
times = seconds.map(lambda s: T0 + timedelta(seconds=s))
maybe_times = st.none() | times
# no NUL (PostgreSQL refuses it in text) and no lone surrogates
texts = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=240)
maybe_ids = st.none() | st.text("abc-0123456789", min_size=1, max_size=20)


@st.composite
def items(draw: st.DrawFn, state: DeliveryState) -> WorkItem:
    return WorkItem(
        key_of(next(_keys)),
        state,
        created_at=draw(times),
        next_attempt_at=draw(maybe_times),
        attempts=draw(st.integers(0, 20)),
        budget_used=draw(st.integers(0, 20)),
        window_started_at=draw(maybe_times),
        first_attempt_at=draw(maybe_times),
        last_attempt_at=draw(maybe_times),
        last_failure_class=draw(st.none() | st.sampled_from(FailureClass)),
        last_detail=draw(st.none() | texts.map(lambda t: t[:200])),
        lease_owner=draw(st.none() | st.just("worker-1")),
        lease_token=draw(st.integers(0, 9)),
        lease_expires_at=draw(maybe_times),
        first_claimed_at=draw(maybe_times),
        provider_message_id=draw(maybe_ids),
        sent_at=draw(maybe_times),
        replayed_at=draw(maybe_times),
        dedupe_until=draw(maybe_times),
    )


effects = st.lists(
    st.one_of(
        st.just(RefundBudget()),
        st.just(Reopen()),
        st.just(ClearDedupe()),
        times.map(ResendUntil),
        st.sampled_from(["max_attempts", "permanent", "unknown_unresolved"]).map(WriteDeadLetter),
    ),
    max_size=3,
    unique_by=type,
).map(tuple)


@st.composite
def cases(draw: st.DrawFn) -> tuple[WorkItem, Transition]:
    expected, target = draw(st.sampled_from(MOVES))
    # mostly the item the guard expects; sometimes another state or a stale token
    state = draw(st.sampled_from([expected] * 4 + list(DeliveryState)))
    item = draw(items(state))
    token = item.lease_token if draw(st.integers(0, 4)) else item.lease_token + 1
    chosen: tuple[Effect, ...] = draw(effects)
    t = Transition(
        item.key,
        expected,
        token,
        target,
        draw(times),
        next_attempt_at=draw(maybe_times),
        failure_class=draw(st.none() | st.sampled_from(FailureClass)),
        detail=draw(st.none() | texts),
        provider_message_id=draw(maybe_ids),
        audit=draw(st.none() | st.just(AuditNote("operator:test", "test", "property"))),
        effects=chosen,
    )
    return item, t


def insert_item(ledger: SqlLedger, item: WorkItem) -> None:
    row = {f.name: getattr(item, f.name) for f in fields(WorkItem) if f.name != "key"}
    row |= {
        "operation_key": str(item.key),
        "period": str(item.period),
        "customer_id": item.key.customer_id,
        "state": item.state.value,
        "last_failure_class": item.last_failure_class and item.last_failure_class.value,
        "updated_at": item.created_at,
    }
    with ledger.engine.begin() as conn:
        conn.execute(insert(work_items), row)


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_the_sql_ledger_stores_what_apply_says(sql_ledger: SqlLedger, case) -> None:
    item, t = case
    insert_item(sql_ledger, item)
    try:
        expected = apply(item, t)
    except LostRace:
        with pytest.raises(LostRace):
            sql_ledger.apply(t)
        assert sql_ledger.get(item.key) == item
        return
    sql_ledger.apply(t)
    assert sql_ledger.get(item.key) == expected
    dead = [d for d in sql_ledger.dead_letters(item.period) if d.key == item.key]
    assert [d.reason for d in dead] == ([t.dead_letter_reason] if t.dead_letter_reason else [])
    audit = [e for e in sql_ledger.audit_log(item.period) if e.key == item.key]
    assert len(audit) == (1 if t.audit else 0)
