"""`no_invalid_recipients` (WARN on `eligibility_snapshot`): eligible customers left out for an
invalid id or an address over 320 characters, recounted from the customer source."""

import dagster as dg

from digest_pipeline.domain.model import Customer
from digest_pipeline_tests.builders import customer_id, make_customer
from digest_pipeline_tests.dagster.harness import checks, metadata

LONG = "a" * 64 + "@" + "b" * 300


def test_a_clean_source_passes(world_of):
    world = world_of()
    verdict = checks(world.materialize())["no_invalid_recipients"]
    assert verdict.passed
    assert verdict.metadata["invalid_ids"].value == 0


def test_left_out_customers_warn_with_counts_and_only_safe_ids(world_of):
    world = world_of(customers=3)
    world.source.update(Customer("bad id\x1b[2J", "x@example.com", True, True))
    world.source.update(make_customer(2, email=LONG))
    world.source.update(make_customer(9, email=LONG, opted_in=False))  # not eligible

    result = world.materialize()

    verdict = checks(result)["no_invalid_recipients"]
    assert not verdict.passed
    assert verdict.severity is dg.AssetCheckSeverity.WARN
    assert result.success  # a warning: the week is still delivered to everyone else
    values = {k: v.value for k, v in verdict.metadata.items()}
    assert (values["invalid_ids"], values["long_addresses"], values["violations"]) == (1, 1, 2)
    assert values["sample"] == [customer_id(2)]
    assert "bad id" not in str(values)
    assert "@" not in str(values)
    assert (verdict.description or "").startswith(
        "2026-W42: 1 eligible customer(s) with an invalid id"
    )
    assert metadata(result, "eligibility_snapshot")["eligible"] == 2
