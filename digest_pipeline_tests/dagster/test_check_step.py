"""Both ways of placing a week's checks refuse, as the definitions load, a check they cannot run."""

import dagster as dg
import pytest

from digest_pipeline.component.asset_checks import CLEANUP_CHECKS, SNAPSHOT_CHECKS
from digest_pipeline.component.check_step import asset_with_checks, check_step
from digest_pipeline.component.naming import Names, Resources
from digest_pipeline.component.spec import DigestSpec

DIGEST = DigestSpec(Names())


def test_a_step_refuses_a_check_of_another_asset():
    with pytest.raises(ValueError, match="every check of the digest_content step must be on"):
        check_step(DIGEST, "digest_content", SNAPSHOT_CHECKS)


def test_an_asset_refuses_a_check_of_another_asset():
    with pytest.raises(ValueError, match="every check of the eligibility_snapshot step"):

        @asset_with_checks(DIGEST, CLEANUP_CHECKS, needs=("ledger", "clock"))
        def eligibility_snapshot(
            context: dg.AssetExecutionContext, r: Resources
        ) -> dg.MaterializeResult[None]:
            return dg.MaterializeResult()


def test_an_asset_must_take_every_resource_its_checks_read():
    # `no_invalid_recipients` reads the customer source: a step without it could not run it
    with pytest.raises(ValueError, match=r"resources its checks read: \['customer_source'\]"):

        @asset_with_checks(DIGEST, SNAPSHOT_CHECKS, needs=("ledger", "clock"))
        def eligibility_snapshot(
            context: dg.AssetExecutionContext, r: Resources
        ) -> dg.MaterializeResult[None]:
            return dg.MaterializeResult()
