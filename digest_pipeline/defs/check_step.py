"""One Dagster step evaluates every check of an asset: each check is a spec and a function.

A step per check cost each check Dagster's per-step start, events and (under the multiprocess or
Celery executor) a process, for a query that takes milliseconds; eleven of them were most of a
small week's fixed cost. Grouped, the UI still shows each check by its own name, severity and
blocking flag, a failing blocking check still stops its asset's downstream, and a check executed
alone from the UI runs alone (the step can be subset).
"""

import inspect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import dagster as dg

from digest_pipeline.defs.partitions import weekly_partitions
from digest_pipeline.defs.report import PARTITIONS_NOTE
from digest_pipeline.defs.resources import DeliveryResource
from digest_pipeline.domain.periods import Period
from digest_pipeline.ports import Clock, CustomerSource, Ledger


@dataclass(frozen=True)
class CheckInputs:
    """What a check reads: the week, and the run's resources (only those its step requires)."""

    period: Period
    resources: Any

    @property
    def ledger(self) -> Ledger:
        ledger: Ledger = self.resources.ledger
        return ledger

    @property
    def clock(self) -> Clock:
        clock: Clock = self.resources.clock
        return clock

    @property
    def customer_source(self) -> CustomerSource:
        source: CustomerSource = self.resources.customer_source
        return source

    @property
    def delivery(self) -> DeliveryResource:
        delivery: DeliveryResource = self.resources.delivery
        return delivery


@dataclass(frozen=True)
class Check:
    """One asset check: its name, what it needs and how it judges one week."""

    name: str
    asset: str
    description: str
    evaluate: Callable[[CheckInputs], dg.AssetCheckResult]
    #: resource keys `evaluate` reads through its `CheckInputs`
    needs: frozenset[str]
    blocking: bool = False

    @property
    def spec(self) -> dg.AssetCheckSpec:
        return dg.AssetCheckSpec(
            self.name,
            asset=self.asset,
            description=f"{self.description}\n\n{PARTITIONS_NOTE}",
            blocking=self.blocking,
            partitions_def=weekly_partitions,
        )


def check(
    asset: str, *needs: str, blocking: bool = False
) -> Callable[[Callable[[CheckInputs], dg.AssetCheckResult]], Check]:
    """Makes a function a `Check` of `asset`, named after it, described by its docstring."""

    def wrap(fn: Callable[[CheckInputs], dg.AssetCheckResult]) -> Check:
        description = inspect.cleandoc(fn.__doc__ or "")
        return Check(fn.__name__, asset, description, fn, frozenset(needs), blocking)

    return wrap


def check_step(asset: str, checks: Sequence[Check]) -> dg.AssetChecksDefinition:
    """The one step that evaluates `checks` (all of `asset`), blocking ones first.

    Every selected check is evaluated before Dagster fails the step for a failed blocking one,
    so a red invariant never hides the warnings beside it.
    """
    if any(c.asset != asset for c in checks):
        raise ValueError(f"every check of the {asset} step must be on {asset}")
    ordered = sorted(checks, key=lambda c: not c.blocking)

    @dg.multi_asset_check(
        name=f"{asset}_checks",
        specs=[c.spec for c in ordered],
        can_subset=True,
        required_resource_keys=set().union(*(c.needs for c in ordered)),
        description=f"The asset checks of `{asset}`, evaluated in one step.",
    )
    def _step(context: dg.AssetCheckExecutionContext) -> Iterator[dg.AssetCheckResult]:
        inputs = CheckInputs(Period.parse(context.partition_key), context.resources)
        selected = context.selected_asset_check_keys
        for c in ordered:
            key = dg.AssetCheckKey(dg.AssetKey(c.asset), c.name)
            if key in selected:
                yield c.evaluate(inputs)._replace(asset_key=key.asset_key, check_name=c.name)

    return _step
