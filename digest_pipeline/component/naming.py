"""One digest instance's names in Dagster: asset keys, resource keys, jobs, schedules and sensors.

The default instance, `digest`, keeps the names the graph has always had (`eligibility_snapshot`,
`weekly_digest_job`, the resource `ledger`), so an install's history stays where it is. Any other
instance prefixes each of them with its own name (`vip_digest/eligibility_snapshot`,
`vip_digest_weekly_digest_job`, `vip_digest_ledger`), so two instances in one code location never
share a definition, a resource or a run.
"""

from dataclasses import dataclass
from typing import Any

import dagster as dg

from digest_pipeline.domain.periods import DEFAULT_INSTANCE
from digest_pipeline.ports import Clock, Composer, CustomerSource, Ledger, Mailer

#: the run tag naming the instance whose job a run is of
INSTANCE_TAG = "digest/instance"


@dataclass(frozen=True)
class Names:
    """What one instance's definitions are called."""

    instance: str = DEFAULT_INSTANCE

    @property
    def prefixed(self) -> bool:
        return self.instance != DEFAULT_INSTANCE

    def asset(self, name: str) -> dg.AssetKey:
        """The key of one of the graph's assets: `name`, or `<instance>/name`."""
        return dg.AssetKey([self.instance, name] if self.prefixed else [name])

    def named(self, name: str) -> str:
        """A job's, schedule's, sensor's, op's or resource's name: `name`, or `<instance>_name`."""
        return f"{self.instance}_{name}" if self.prefixed else name

    @property
    def group(self) -> str:
        """The asset group the UI shows the graph under."""
        return self.instance

    def keys(self, *roles: str) -> set[str]:
        """The resource keys of `roles` (`ledger`, `clock`, …) for this instance."""
        return {self.named(r) for r in roles}

    def resources(self, resources: Any) -> "Resources":
        """A step's or tick's resources, read under this instance's keys."""
        return Resources(self, resources)


@dataclass(frozen=True)
class Resources:
    """The run's resources of one instance, by role (only those its step requires exist)."""

    names: Names
    raw: Any

    def _get(self, role: str) -> Any:
        return getattr(self.raw, self.names.named(role))

    @property
    def ledger(self) -> Ledger:
        ledger: Ledger = self._get("ledger")
        return ledger

    @property
    def clock(self) -> Clock:
        clock: Clock = self._get("clock")
        return clock

    @property
    def composer(self) -> Composer:
        composer: Composer = self._get("composer")
        return composer

    @property
    def mailer(self) -> Mailer:
        mailer: Mailer = self._get("mailer")
        return mailer

    @property
    def customer_source(self) -> CustomerSource:
        source: CustomerSource = self._get("customer_source")
        return source

    @property
    def delivery(self) -> Any:
        """The instance's `DeliveryResource` (typed where it is used: resources.py)."""
        return self._get("delivery")
