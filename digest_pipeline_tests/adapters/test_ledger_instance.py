"""The ledger records its digest instance and refuses a process configured with another name.

Over SQLite and PostgreSQL: the first open records the name (`wiring.ledger_on`), a later open
under another name is refused in one line with nothing changed, a ledger made before instances
is `digest`'s once it holds work and takes the first name while empty, and a helper process
opens the run's ledger only under the run's instance.
"""

from collections.abc import Callable
from datetime import timedelta

import pytest
from sqlalchemy import Engine, String, delete, select

from digest_pipeline.adapters.sql.engine import summarize_error
from digest_pipeline.adapters.sql.identity import ledger_id, recorded_instance, stored_ledger_id
from digest_pipeline.adapters.sql.ledger import SqlLedger, open_same_ledger
from digest_pipeline.adapters.sql.schema import ledger_identity, metadata, work_items
from digest_pipeline.domain.errors import InvalidInstanceName, LedgerMismatch
from digest_pipeline.domain.periods import OperationKey, Period, validate_instance_name
from digest_pipeline.wiring import ledger_on
from digest_pipeline_tests.builders import seed_period
from digest_pipeline_tests.conftest import SQL_BACKENDS, T0, W42

VIP = "vip_digest"
LATER = T0 + timedelta(hours=1)


@pytest.fixture(params=SQL_BACKENDS)
def engine(request: pytest.FixtureRequest, sql_engine_factory: Callable[[str], Engine]) -> Engine:
    return sql_engine_factory(request.param)


def dump(engine: Engine) -> dict[str, list[tuple[object, ...]]]:
    """Every row of every ledger table, in primary-key order."""
    with engine.connect() as conn:
        return {
            t.name: [tuple(r) for r in conn.execute(select(t).order_by(*t.primary_key.columns))]
            for t in metadata.sorted_tables
        }


def stored_instance(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return conn.execute(select(ledger_identity.c.instance)).scalar_one_or_none()


def refusal(engine: Engine, name: str) -> str:
    """The one line `ledger_on` refuses `name` with; asserts that nothing changed."""
    before = dump(engine)
    with pytest.raises(LedgerMismatch) as refused:
        ledger_on(engine, name, now=LATER)
    assert dump(engine) == before
    message = str(refused.value)
    assert "\n" not in message
    if (password := engine.url.password) is not None:
        assert str(password) not in message
    return message


def test_the_first_open_records_the_instance_and_another_name_is_refused(engine):
    ledger = ledger_on(engine, VIP, now=T0)
    seed_period(ledger, 3)

    assert ledger.instance == VIP
    assert stored_instance(engine) == VIP
    assert stored_ledger_id(engine) is not None  # a new ledger's identity row, made with it
    message = refusal(engine, "digest")
    assert "belongs to digest instance vip_digest, not digest" in message
    assert "DIGEST_INSTANCE=vip_digest" in message
    assert ledger_on(engine, VIP, now=LATER).items(W42) == ledger.items(W42)


@pytest.mark.parametrize("identity_row", [True, False], ids=["identity_row", "no_identity_row"])
def test_a_ledger_from_before_instances_that_holds_work_is_digests(engine, identity_row):
    keys = seed_period(SqlLedger(engine), 2)
    if identity_row:
        ledger_id(engine, T0)  # a run's process made it, before instances existed

    assert "belongs to digest instance digest, not vip_digest" in refusal(engine, VIP)
    ledger = ledger_on(engine, "digest", now=LATER)
    assert [i.key for i in ledger.items(W42)] == keys
    assert all(str(k).startswith("digest:") for k in keys)
    assert recorded_instance(engine) == "digest"


def test_an_empty_ledger_from_before_instances_takes_the_first_name(engine):
    made = ledger_id(engine, T0)
    assert stored_instance(engine) is None

    ledger_on(engine, VIP, now=LATER)

    assert stored_instance(engine) == VIP
    assert stored_ledger_id(engine) == made
    assert "not digest" in refusal(engine, "digest")


def test_a_name_no_instance_can_have_is_refused_before_the_ledger_is_touched(engine):
    before = dump(engine)
    with pytest.raises(InvalidInstanceName):
        ledger_on(engine, "Bad-Name", now=T0)
    assert dump(engine) == before


def test_a_helper_opens_the_runs_ledger_only_as_the_runs_instance(engine):
    run = ledger_on(engine, VIP, now=T0)
    made = ledger_id(engine, T0)
    url = engine.url.render_as_string(hide_password=False)

    with pytest.raises(LedgerMismatch, match="digest instance vip_digest, expected digest"):
        open_same_ledger(url, made)
    helper = open_same_ledger(url, made, VIP)
    try:
        assert helper.instance == VIP
        assert helper.items(W42) == run.items(W42)
    finally:
        helper.engine.dispose()


@pytest.mark.integration
def test_a_postgresql_ledgers_recipe_carries_its_instance(sql_engine_factory):
    engine = sql_engine_factory("postgres")
    ledger = ledger_on(engine, VIP, now=T0)
    recipe = ledger.recipe()
    assert recipe is not None
    helper = recipe()
    assert isinstance(helper, SqlLedger)
    try:
        assert helper.instance == VIP
    finally:
        helper.engine.dispose()


def test_a_frozen_customer_without_a_work_item_is_named_by_the_instances_key(engine):
    ledger = ledger_on(engine, VIP, now=T0)
    lost = seed_period(ledger, 3)[2]
    with engine.begin() as conn:
        conn.execute(delete(work_items).where(work_items.c.operation_key == str(lost)))

    (visible,) = ledger.check_invariants(W42, T0, ["every_customer_has_visible_state"])

    assert (visible.passed, visible.sample) == (False, (str(lost),))
    assert str(lost).startswith("vip_digest:")


def test_the_longest_key_of_any_instance_fits_every_key_column():
    longest = max(n for n in range(1, 64) if _valid("a" * n))
    key = OperationKey(Period(2026, 53), "c" * 128, "a" * longest)
    types = [t.c.operation_key.type for t in metadata.sorted_tables if "operation_key" in t.c]
    assert types
    assert all(isinstance(t, String) and t.length is not None for t in types)
    assert all(len(str(key)) <= t.length for t in types if isinstance(t, String) and t.length)


def _valid(name: str) -> bool:
    try:
        validate_instance_name(name)
    except InvalidInstanceName:
        return False
    return True


def test_a_database_error_names_another_instances_keys_and_hides_the_rest():
    key = OperationKey(W42, "customer-0001", VIP)
    params = [{"key": str(key), "recipient": "shopper.0001@mailbox.example"}]

    message, _ = summarize_error("INSERT INTO digest_rows (x) VALUES (?)", params, None)

    assert f"(operation keys {key})" in message
    assert "shopper" not in message
