"""Builds one instance's definitions: assets and checks, job, schedule, sweeper and resources."""

from collections.abc import Mapping
from typing import Any

import dagster as dg

from digest_pipeline.adapters.clock import SystemClock
from digest_pipeline.component.asset_checks import deliveries_checks
from digest_pipeline.component.assets import build_assets
from digest_pipeline.component.deliveries import build_deliveries
from digest_pipeline.component.io_manager import LedgerIOManager
from digest_pipeline.component.naming import Names
from digest_pipeline.component.resources import (
    ComposerResource,
    CustomerSourceResource,
    DeliveryResource,
    LedgerResource,
    MailerResource,
)
from digest_pipeline.component.schedules import build_job, build_schedule
from digest_pipeline.component.sensors import build_sensor
from digest_pipeline.component.spec import DigestSpec


def build_defs(digest: DigestSpec) -> dg.Definitions:
    """Everything one instance defines, under its own names."""
    job = build_job(digest)
    return dg.Definitions(
        assets=[*build_assets(digest), build_deliveries(digest)],
        asset_checks=[deliveries_checks(digest)],
        jobs=[job],
        schedules=[build_schedule(digest, job)],
        sensors=[build_sensor(digest, job)],
        resources=build_resources(digest.names, digest.settings),
    )


def build_resources(names: Names, settings: Mapping[str, str]) -> dict[str, Any]:
    """Every resource key an instance's assets, checks, schedule and sensor ask for.

    Keyed by the instance's own names (`ledger`, or `vip_digest_ledger`), so two instances in
    one code location never share one; each reads the instance's `settings`.
    """
    own = dict(settings)
    return {
        names.named("ledger"): LedgerResource(instance_settings=own),
        names.named("customer_source"): CustomerSourceResource(instance_settings=own),
        names.named("mailer"): MailerResource(instance_settings=own),
        names.named("composer"): ComposerResource(instance_settings=own),
        # A plain value: it has nothing to configure, and a field-less ConfigurableResource
        # trips a pydantic deprecation inside Dagster (`__fields__` fallback).
        names.named("clock"): SystemClock(),
        names.named("delivery"): DeliveryResource(instance_settings=own),
        names.named("io_manager"): LedgerIOManager(instance_settings=own),
    }
