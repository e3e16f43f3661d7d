"""The Dagster tier's world: fakes bound as resources, and one call to materialise a week.

Addresses and product titles are distinctive, so a test can search the whole event log for them.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import dagster as dg

from digest_pipeline.component.guards import REFUSED_TAG
from digest_pipeline.component.resources import DeliveryResource
from digest_pipeline.domain.catalogue import Order, Product
from digest_pipeline.ports import Mailer
from digest_pipeline_tests.builders import customer_id, make_customer
from digest_pipeline_tests.conftest import T0, W42
from digest_pipeline_tests.dagster.graph import (
    ASSET_NAMES,
    asset,
    deliveries_checks,
    project,
    sweeper,
)
from digest_pipeline_tests.fakes import (
    FakeComposer,
    FakeCustomerSource,
    FakeLedger,
    FakeMailer,
    FixedClock,
)

PARTITION = "2026-W42-1"
ASSETS = tuple(asset(name) for name in ASSET_NAMES)
#: the job's step of checks only (the other assets evaluate their checks in their own steps)
CHECKS = (deliveries_checks(),)
#: the checks the job evaluates, in its asset steps and its check step
CHECK_COUNT = sum(len(list(d.check_specs)) for d in (*ASSETS, *CHECKS))
PRODUCTS = 6
#: the three assets before delivery, and the two the sweeper re-runs
BEFORE_DELIVERY = ["eligibility_snapshot", "digest_content", "digest_work_items"]
DELIVERY_AND_CLEANUP = ["digest_deliveries", "digest_cleanup"]


def product_title(i: int) -> str:
    return f"Hand-Thrown Celadon Teapot No. {i:03d}"


def catalogue() -> list[Product]:
    return [
        Product(
            product_id=f"product-{i:03d}",
            title=product_title(i),
            category="Kitchen" if i % 2 else "Garden",
            price_cents=1_250 + i,
            currency="EUR",
            url=f"https://shop.example/p/{i:03d}",
            image_url=None,
            created_at=W42.starts_at + timedelta(days=1, hours=i),
        )
        for i in range(PRODUCTS)
    ]


def orders(customers: int) -> list[Order]:
    return [
        Order(
            f"order-{n:04d}", customer_id(n), f"product-{n % PRODUCTS:03d}", T0 - timedelta(days=9)
        )
        for n in range(1, customers + 1)
    ]


@dataclass
class World:
    """One shop and one provider, all fakes, at Monday 06:00 after 2026-W42."""

    instance: dg.DagsterInstance
    customers: int = 5
    clock: FixedClock = field(default_factory=lambda: FixedClock(T0))
    ledger: FakeLedger = field(default_factory=FakeLedger)
    composer: FakeComposer = field(default_factory=FakeComposer)
    mailer: FakeMailer = field(init=False)
    source: FakeCustomerSource = field(init=False)

    def __post_init__(self) -> None:
        self.mailer = FakeMailer(clock=self.clock)
        self.source = FakeCustomerSource(
            [make_customer(n) for n in range(1, self.customers + 1)],
            catalogue(),
            orders(self.customers),
        )

    def resources(self, **delivery: Any) -> dict[str, Any]:
        return {
            "ledger": self.ledger,
            "customer_source": self.source,
            "mailer": self.mailer,
            "composer": self.composer,
            "clock": self.clock,
            "delivery": DeliveryResource(**delivery),
        }

    def materialize(
        self,
        *,
        selection: dg.AssetSelection | Sequence[str] | None = None,
        raise_on_error: bool = True,
        mailer: Mailer | None = None,
        **delivery: Any,
    ) -> dg.ExecuteInProcessResult:
        """Materialises the week (all five assets and their checks, or `selection`)."""
        resources = self.resources(**delivery)
        if mailer is not None:
            resources["mailer"] = mailer
        return dg.materialize(
            [*ASSETS, *CHECKS],
            partition_key=PARTITION,
            resources=resources,
            instance=self.instance,
            selection=selection,
            raise_on_error=raise_on_error,
        )


def sweep(world: World) -> Any:
    """One tick of the retry sweeper over the world's ledger, resolved against the project."""
    with dg.build_sensor_context(resources=world.resources(), definitions=project()) as ctx:
        return sweeper().evaluate_tick(ctx)


def metadata(result: dg.ExecuteInProcessResult, asset: str) -> dict[str, Any]:
    """The raw values of the asset's (single) materialisation metadata in the run."""
    [mat] = result.asset_materializations_for_node(asset)
    return {k: v.value for k, v in mat.metadata.items()}


def refusal(world: World, result: dg.ExecuteInProcessResult) -> str:
    """The refused week's line: the run's `digest/refused` tag, which the run ended with.

    Fails unless the run ended without error and neither `digest_deliveries` nor
    `digest_cleanup` was materialised (a refusal comes at the latest at the delivery's plan).
    """
    assert result.success
    materialised = {e.asset_key for e in result.get_asset_materialization_events()}
    assert not materialised & {dg.AssetKey(k) for k in DELIVERY_AND_CLEANUP}
    run = world.instance.get_run_by_id(result.run_id)
    assert run is not None
    line: str = run.tags[REFUSED_TAG]
    return line


def checks(result: dg.ExecuteInProcessResult) -> dict[str, dg.AssetCheckEvaluation]:
    return {e.check_name: e for e in result.get_asset_check_evaluations()}
