"""`digest regenerate`: the runbook's "A product broke the digests", on SQLite and PostgreSQL.

The week's rows were frozen with a product whose image link holds a quote, so every digest
failed to render. Fix the product in the catalogue, regenerate, replay: every customer gets a
digest, once, and the audit trail says who regenerated and why.
"""

import re
from datetime import timedelta

import pytest
from sqlalchemy import insert, update

from digest_pipeline.adapters.mail.outbox import OutboxMailer
from digest_pipeline.adapters.mail.render import Jinja2Composer
from digest_pipeline.adapters.sql.schema import products
from digest_pipeline.domain import catalogue
from digest_pipeline.domain.catalogue import Product
from digest_pipeline.domain.periods import OperationKey
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline_tests.builders import key_of, seed_period, state_of
from digest_pipeline_tests.cli.conftest import OS_USER, World
from digest_pipeline_tests.conftest import W42

CUSTOMERS = 3
BAD_ID = "prod-0002"
BAD_IMAGE = 'https://shop.example/img/prod-0002.jpg" onerror="alert(1)'
GOOD_IMAGE = "https://shop.example/img/prod-0002.jpg"


def catalogue_rows() -> list[Product]:
    return [
        Product(
            f"prod-{n:04d}",
            f"Walnut Board No. {n}",
            "Kitchen",
            1999 + n,
            "EUR",
            f"https://shop.example/p/prod-{n:04d}",
            BAD_IMAGE if n == 2 else None,
            W42.starts_at - timedelta(days=100),
        )
        for n in range(1, 5)
    ]


def composer(world: World) -> Jinja2Composer:
    return Jinja2Composer(
        sender="digest@example.com",
        unsubscribe_url="https://shop.example/unsubscribe/{customer_id}?token={token}",
        unsubscribe_secret="s3cret",
        clock=world.clock,
    )


def broken_week(world: World) -> list[OperationKey]:
    """Rows generated before the screening: every digest holds the bad product, and failed."""
    made = catalogue_rows()
    with world.engine.begin() as conn:
        conn.execute(insert(products), [vars(p) for p in made])
    keys = seed_period(world.ledger, CUSTOMERS, now=world.clock.now(), rows_per_customer=0)
    world.ledger.add_digest_rows(r for k in keys for r in catalogue.digest_rows_for(k, made))
    world.deliver(OutboxMailer(world.outbox_dir), composer=composer(world))
    assert {state_of(world.ledger, k) for k in keys} == {DeliveryState.FAILED}
    return keys


def fix_the_product(world: World) -> None:
    with world.engine.begin() as conn:
        conn.execute(
            update(products).where(products.c.product_id == BAD_ID).values(image_url=GOOD_IMAGE)
        )


def test_fix_regenerate_replay_delivers_every_failed_customer(world):
    keys = broken_week(world)
    fix_the_product(world)

    dry = world.cli(
        "regenerate", "--period", "2026-W42", "--reason", "image link fixed", "--dry-run",
        "--json",
    )  # fmt: skip
    before = world.dump()
    assert dry.json()["regenerated"] == CUSTOMERS
    assert world.dump() == before

    run = world.cli("regenerate", "--period", "2026-W42", "--reason", "image link fixed")
    assert run.code == 0, run.err
    assert f"regenerated {CUSTOMERS} of {CUSTOMERS} never-sent items" in run.out
    for k in keys:
        assert f"  {k}" in run.out  # the keys to replay, to paste into digest replay
    assert {state_of(world.ledger, k) for k in keys} == {DeliveryState.FAILED}
    [audit] = [e for e in world.ledger.audit_log(W42) if e.action == "regenerate"]
    assert (audit.actor, audit.key) == (OS_USER, None)  # the OS user, by default
    assert audit.reason.startswith("image link fixed (never-sent items: failed 3")

    world.clock.advance(timedelta(minutes=1))
    replay = world.cli(
        "replay", "--period", "2026-W42", *(a for k in keys for a in ("--key", str(k))),
        "--reason", "catalogue fixed",
    )  # fmt: skip
    assert replay.code == 0, replay.err
    world.deliver(OutboxMailer(world.outbox_dir), composer=composer(world))

    assert {state_of(world.ledger, k) for k in keys} == {DeliveryState.SENT}
    assert len(world.outbox_files()) == CUSTOMERS
    again = world.cli("regenerate", "--period", "2026-W42", "--reason", "again", "--json").json()
    assert (again["considered"], again["regenerated"]) == ({}, 0)


def test_the_dry_run_names_the_excluded_products_while_the_catalogue_is_still_bad(world):
    broken_week(world)
    before = world.dump()

    run = world.cli("regenerate", "--period", "2026-W42", "--reason", "look", "--dry-run")

    assert run.code == 0, run.err
    assert re.search(rf"^{BAD_ID} +image_url$", run.out, re.MULTILINE)
    assert "onerror" not in run.out
    assert "dry run: nothing changed" in run.out
    assert world.dump() == before


@pytest.mark.parametrize("reason", [" ", "fixed\x1b[2J"], ids=["blank", "control-character"])
def test_a_blank_or_unprintable_reason_is_refused_and_nothing_changes(world, reason):
    broken_week(world)
    before = world.dump()

    run = world.cli("regenerate", "--period", "2026-W42", "--reason", reason)

    assert (run.code, run.out) == (2, "")
    assert run.err.startswith("digest regenerate: error: --reason")
    assert world.dump() == before
    assert key_of(1) in {k for k in world.ledger.keys_with_rows(W42)}
