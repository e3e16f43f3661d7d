"""Where a week's asset checks run: in their asset's own step, or in one step of their own.

A step per check cost each check Dagster's per-step start, events and (under the multiprocess or
Celery executor) a process, for a query that takes milliseconds. An asset whose checks can run
without it evaluates them in its own step (`asset_with_checks`); the delivery graph's run in one
step beside it (`check_step`), since running one of them alone must not deliver. Either way the
UI shows each check by its own name, severity and blocking flag, a failing blocking check stops
its asset's downstream, and a check executed alone from the UI runs alone.
"""

import inspect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import dagster as dg

from digest_pipeline.component.naming import Names, Resources
from digest_pipeline.component.report import PARTITIONS_NOTE
from digest_pipeline.component.resources import DeliveryResource
from digest_pipeline.component.spec import DigestSpec
from digest_pipeline.domain.periods import Period
from digest_pipeline.ports import Clock, CustomerSource, Ledger


@dataclass(frozen=True)
class CheckInputs:
    """What a check reads: the week, and the run's resources (only those its step requires)."""

    period: Period
    resources: Resources

    @property
    def ledger(self) -> Ledger:
        return self.resources.ledger

    @property
    def clock(self) -> Clock:
        return self.resources.clock

    @property
    def customer_source(self) -> CustomerSource:
        return self.resources.customer_source

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

    def spec(self, digest: DigestSpec) -> dg.AssetCheckSpec:
        """The check as `digest`'s instance defines it, on its asset and partitions."""
        return dg.AssetCheckSpec(
            self.name,
            asset=digest.names.asset(self.asset),
            description=f"{self.description}\n\n{PARTITIONS_NOTE}",
            blocking=self.blocking,
            partitions_def=digest.partitions,
        )


def check(
    asset: str, *needs: str, blocking: bool = False
) -> Callable[[Callable[[CheckInputs], dg.AssetCheckResult]], Check]:
    """Makes a function a `Check` of `asset`, named after it, described by its docstring."""

    def wrap(fn: Callable[[CheckInputs], dg.AssetCheckResult]) -> Check:
        description = inspect.cleandoc(fn.__doc__ or "")
        return Check(fn.__name__, asset, description, fn, frozenset(needs), blocking)

    return wrap


def _ordered(asset: str, checks: Sequence[Check]) -> list[Check]:
    """`checks`, all of `asset`, blocking ones first."""
    if any(c.asset != asset for c in checks):
        raise ValueError(f"every check of the {asset} step must be on {asset}")
    return sorted(checks, key=lambda c: not c.blocking)


def _evaluate(
    context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext,
    names: Names,
    ordered: Sequence[Check],
) -> Iterator[dg.AssetCheckResult]:
    """The results of the selected checks among `ordered`, every one of them.

    Every selected check is evaluated before Dagster fails the step for a failed blocking one,
    so a red invariant never hides the warnings beside it.
    """
    inputs = CheckInputs(Period.parse(context.partition_key), names.resources(context.resources))
    selected = context.selected_asset_check_keys
    for c in ordered:
        key = dg.AssetCheckKey(names.asset(c.asset), c.name)
        if key in selected:
            yield c.evaluate(inputs)._replace(asset_key=key.asset_key, check_name=c.name)


def check_step(digest: DigestSpec, asset: str, checks: Sequence[Check]) -> dg.AssetChecksDefinition:
    """The one step that evaluates `checks` (all of `asset`), blocking ones first."""
    ordered, names = _ordered(asset, checks), digest.names

    @dg.multi_asset_check(
        name=names.named(f"{asset}_checks"),
        specs=[c.spec(digest) for c in ordered],
        can_subset=True,
        required_resource_keys=names.keys(*set().union(*(c.needs for c in ordered))),
        description=f"The asset checks of `{asset}`, evaluated in one step.",
    )
    def _step(context: dg.AssetCheckExecutionContext) -> Iterator[dg.AssetCheckResult]:
        yield from _evaluate(context, names, ordered)

    return _step


#: what an asset's step runs: `fn(context, resources)`, None for a refused week
AssetFn = Callable[[dg.AssetExecutionContext, Resources], dg.MaterializeResult[None] | None]


def asset_with_checks(
    digest: DigestSpec,
    checks: Sequence[Check] = (),
    *,
    needs: Sequence[str],
    deps: Sequence[dg.AssetKey] = (),
) -> Callable[[AssetFn], dg.AssetsDefinition]:
    """Makes `fn` one of `digest`'s weekly assets, named after it, whose step evaluates `checks`.

    `fn(context, resources)` materialises the asset, reading the resources `needs` names, or
    returns None for a refused week (guards.py): the step then yields nothing, so the asset is
    not materialised, its checks are not evaluated and every step after it is skipped. Its
    docstring is the asset's description. The step can be subset: materialising without the
    checks skips them, and executing a check alone from the UI evaluates it without running
    `fn`. The checks read only resources `fn` already takes.
    """
    names = digest.names

    def wrap(fn: AssetFn) -> dg.AssetsDefinition:
        name = fn.__name__
        ordered = _ordered(name, checks)
        if missing := set().union(*(c.needs for c in ordered)) - set(needs):
            raise ValueError(f"{name} must take the resources its checks read: {sorted(missing)}")
        key = names.asset(name)

        def step(
            context: dg.AssetExecutionContext,
        ) -> Iterator[dg.MaterializeResult[None] | dg.AssetCheckResult]:
            if key in context.selected_asset_keys:
                result = fn(context, names.resources(context.resources))
                if result is None:
                    return
                yield result
            yield from _evaluate(context, names, ordered)

        return dg.multi_asset(
            name=names.named(name),
            specs=[
                dg.AssetSpec(
                    key,
                    deps=deps,
                    group_name=names.group,
                    partitions_def=digest.partitions,
                    description=f"{inspect.cleandoc(fn.__doc__ or '')}\n\n{PARTITIONS_NOTE}",
                    # a refused week yields no materialisation, and the steps after it skip
                    skippable=True,
                    # the instance's own: another instance's would open that instance's ledger
                ).with_io_manager_key(names.named("io_manager"))
            ],
            check_specs=[c.spec(digest) for c in ordered],
            can_subset=True,
            required_resource_keys=names.keys(*needs),
        )(step)

    return wrap
