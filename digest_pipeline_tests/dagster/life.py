"""The life test's world: the project's Definitions over a real SQL shop, on a virtual clock.

`Shop` is the shop's side: demo data from `seed_demo`, then the changes a shop sees between
weekly digests (opt-outs, customers going inactive, new addresses, new orders) written straight
into the source tables `SqlCustomerSource` reads, with a model of who should be selected next.
`Life` plays the Dagster daemon: it evaluates `weekly_digest_schedule` and `digest_retry_sweeper`
at virtual instants, launches exactly what they request (partition, tags, asset selection) with
the project's `weekly_digest_job`, and never launches one run key twice, as the daemon would not.
Every run gets the real SQL ledger and customer source, the real composer, and a `FakeMailer`
(the provider: scripted faults per key, and the record of every message it delivered), all on
one `FixedClock`.
"""

import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
from sqlalchemy import Engine, insert, select, update

from digest_pipeline.adapters.demo_data import seed_demo
from digest_pipeline.adapters.sql.customer_source import SqlCustomerSource
from digest_pipeline.adapters.sql.ledger import SqlLedger
from digest_pipeline.adapters.sql.schema import customers as customers_table
from digest_pipeline.adapters.sql.schema import orders as orders_table
from digest_pipeline.adapters.sql.schema import products as products_table
from digest_pipeline.component.io_manager import LedgerIOManager
from digest_pipeline.component.resources import DeliveryResource
from digest_pipeline.domain.periods import Period
from digest_pipeline.settings import load_settings
from digest_pipeline.wiring import build_composer
from digest_pipeline_tests.dagster.graph import project, sweeper
from digest_pipeline_tests.fakes import FakeMailer, FixedClock

#: the provider remembers an idempotency key this long (Resend-style HTTP APIs)
IDEMPOTENCY_WINDOW = timedelta(hours=24)
#: run config that keeps Dagster's console logger to warnings (the event log keeps everything),
#: so the life's table stays readable under `pytest -s`
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
#: what the composer accepts, as `seed_demo` writes good addresses; its typos all fail this
PLAIN_ADDRESS = re.compile(r"[a-z0-9]+(\.[a-z0-9]+)*@example\.(com|org|net)")


def is_plain_address(email: str) -> bool:
    return PLAIN_ADDRESS.fullmatch(email) is not None


def schedule_tick_of(period: Period) -> datetime:
    """Monday 06:00 UTC right after the week: when `weekly_digest_schedule` delivers it."""
    return period.ends_at + timedelta(hours=6)


def with_resources(defs: dg.Definitions, resources: Mapping[str, Any]) -> dg.Definitions:
    """The same assets, checks, jobs, schedules and sensors, with exactly these resources."""
    assert set(resources) == set(defs.resources or {}), "bind every resource key the project does"
    return dg.Definitions(
        assets=defs.assets,
        asset_checks=defs.asset_checks,
        jobs=defs.jobs,
        schedules=defs.schedules,
        sensors=defs.sensors,
        resources=resources,
        executor=defs.executor,
        loggers=defs.loggers,
        metadata=defs.metadata,
    )


@dataclass
class Person:
    email: str
    active: bool
    opted_in: bool

    @property
    def eligible(self) -> bool:
        return self.active and self.opted_in


class Shop:
    """The shop's source tables on the test's database, and what they should select next."""

    def __init__(self, engine: Engine, *, customers: int, seed: int, now: datetime) -> None:
        self._engine = engine
        self._rng = random.Random(seed)
        self.report = seed_demo(engine, customers=customers, seed=seed, now=now)
        c = customers_table.c
        with engine.connect() as conn:
            rows = conn.execute(select(c.customer_id, c.email, c.active, c.opted_in)).all()
            self._products = list(conn.execute(select(products_table.c.product_id)).scalars())
        self.people = {
            r.customer_id: Person(r.email, bool(r.active), bool(r.opted_in)) for r in rows
        }
        self._orders = 0
        self._arrivals = 0

    def eligible(self) -> dict[str, str]:
        """customer id -> address of everyone the next snapshot must select."""
        return {cid: p.email for cid, p in sorted(self.people.items()) if p.eligible}

    def change(self, customer_id: str, **values: Any) -> None:
        """Updates one customer row (`email`, `active`, `opted_in`) as the shop's app would."""
        with self._engine.begin() as conn:
            done = conn.execute(
                update(customers_table)
                .where(customers_table.c.customer_id == customer_id)
                .values(**values)
            )
            assert done.rowcount == 1, customer_id
        person = self.people[customer_id]
        for name, value in values.items():
            setattr(person, name, value)

    def sign_up(self, customer_id: str, email: str, at: datetime) -> None:
        """A new customer who opted in at sign-up."""
        with self._engine.begin() as conn:
            conn.execute(
                insert(customers_table),
                [
                    {
                        "customer_id": customer_id,
                        "email": email,
                        "active": True,
                        "opted_in": True,
                        "created_at": at,
                    }
                ],
            )
        self.people[customer_id] = Person(email, True, True)

    def trade(self, period: Period) -> int:
        """A week of shopping: one new product listed, and orders by about a third of the active."""
        self._arrivals += 1
        product_id = f"prod-life-{self._arrivals:02d}"
        listed = period.starts_at + timedelta(hours=self._rng.randrange(24, 96))
        buyers = [
            c for c, p in sorted(self.people.items()) if p.active and self._rng.random() < 0.35
        ]
        lines = [
            {
                "order_id": f"order-life-{self._orders + n:05d}",
                "customer_id": cid,
                "product_id": self._rng.choice([*self._products, product_id]),
                "ordered_at": listed + timedelta(minutes=self._rng.randrange(60, 3 * 24 * 60)),
            }
            for n, cid in enumerate(buyers, start=1)
        ]
        self._orders += len(lines)
        with self._engine.begin() as conn:
            conn.execute(
                insert(products_table),
                [
                    {
                        "product_id": product_id,
                        "title": f"Limited Stoneware Bowl No. {self._arrivals:02d}",
                        "category": "Kitchen",
                        "price_cents": 2_450,
                        "currency": "EUR",
                        "url": f"https://shop.example/p/{product_id}",
                        "image_url": None,
                        "created_at": listed,
                    }
                ],
            )
            if lines:
                conn.execute(insert(orders_table), lines)
        self._products.append(product_id)
        return len(lines)


@dataclass(frozen=True)
class Launch:
    """One run the test started, and why."""

    #: `schedule`, `sweep` or `operator`
    trigger: str
    partition_key: str
    at: datetime
    run_key: str | None
    result: dg.ExecuteInProcessResult

    @property
    def period(self) -> Period:
        return Period.parse(self.partition_key)

    def metadata(self, asset: str) -> dict[str, Any]:
        [mat] = self.result.asset_materializations_for_node(asset)
        return {k: v.value for k, v in mat.metadata.items()}

    @property
    def failures(self) -> list[str]:
        """Each failed step's key and error, for an assertion message."""
        return [
            f"{e.step_key}: {e.step_failure_data.error.to_string() if e.step_failure_data.error else ''}"
            for e in self.result.all_events
            if e.is_step_failure
        ]

    @property
    def checks(self) -> list[dg.AssetCheckEvaluation]:
        return list(self.result.get_asset_check_evaluations())


@dataclass
class Life:
    """The daemon's part, on virtual time: ticks the schedule and the sweeper, launches runs."""

    instance: dg.DagsterInstance
    engine: Engine
    clock: FixedClock
    root: Path
    delivery: DeliveryResource
    mailer: FakeMailer = field(init=False)
    ledger: SqlLedger = field(init=False)
    launches: list[Launch] = field(default_factory=list)
    #: run keys already launched: the daemon never starts a second run for one
    run_keys: set[str] = field(default_factory=set)
    #: sensor requests not launched because their run key had already run
    deduplicated: int = 0
    #: the virtual instants the sweeper was evaluated at
    sensor_ticks: list[datetime] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ledger = SqlLedger(self.engine)
        self.mailer = FakeMailer(
            idempotent=True,
            idempotency_window=IDEMPOTENCY_WINDOW,
            can_lookup=False,
            clock=self.clock,
        )
        self._source = SqlCustomerSource(self.engine)
        # The composer resource builds its composer with SystemClock (a Date header in real
        # time); here it shares the virtual clock, like everything else.
        self._composer = build_composer(load_settings({}, self.root), self.clock)
        # The project's own Definitions, with every resource key bound to this world's values
        # (execute_in_process cannot override resources already bound to the assets).
        self._defs = with_resources(project(), self.resources())
        self.job = self._defs.resolve_job_def("weekly_digest_job")
        self.schedule = self._defs.resolve_schedule_def("weekly_digest_schedule")

    def resources(self) -> dict[str, Any]:
        return {
            "ledger": self.ledger,
            "customer_source": self._source,
            "mailer": self.mailer,
            "composer": self._composer,
            "clock": self.clock,
            "delivery": self.delivery,
            # the project's own: the fan-out's outputs in this world's ledger database
            "io_manager": LedgerIOManager(
                database_url=self.engine.url.render_as_string(hide_password=False)
            ),
        }

    def _launch(
        self,
        trigger: str,
        partition_key: str,
        *,
        run_key: str | None,
        tags: Mapping[str, str],
        asset_selection: Sequence[dg.AssetKey] | None = None,
    ) -> Launch:
        if run_key is not None:
            assert run_key not in self.run_keys, run_key
            self.run_keys.add(run_key)
        result = self.job.execute_in_process(
            partition_key=partition_key,
            instance=self.instance,
            tags=dict(tags),
            run_config=QUIET,
            asset_selection=list(asset_selection) if asset_selection is not None else None,
            raise_on_error=False,
        )
        launch = Launch(trigger, partition_key, self.clock.now(), run_key, result)
        self.launches.append(launch)
        return launch

    def schedule_tick(self) -> Launch:
        """Evaluates the weekly schedule now and launches its one request."""
        with dg.build_schedule_context(
            instance=self.instance,
            scheduled_execution_time=self.clock.now(),
            resources=self.resources(),
            repository_def=self._defs.get_repository_def(),
        ) as context:
            data = self.schedule.evaluate_tick(context)
        [request] = data.run_requests or []
        assert request.job_name in (None, self.job.name)
        assert request.partition_key is not None
        return self._launch(
            "schedule", request.partition_key, run_key=request.run_key, tags=request.tags
        )

    def sensor_tick(self) -> list[Launch]:
        """Evaluates the retry sweeper now and launches each request whose run key is new."""
        self.sensor_ticks.append(self.clock.now())
        with dg.build_sensor_context(
            instance=self.instance, resources=self.resources(), definitions=self._defs
        ) as context:
            data = sweeper().evaluate_tick(context)
        launched = []
        for request in data.run_requests or []:
            assert request.partition_key is not None
            assert request.asset_selection is not None
            if request.run_key in self.run_keys:
                self.deduplicated += 1
                continue
            launched.append(
                self._launch(
                    "sweep",
                    request.partition_key,
                    run_key=request.run_key,
                    tags=request.tags,
                    asset_selection=request.asset_selection,
                )
            )
        return launched

    def sweep(self, gaps: Sequence[timedelta]) -> list[Launch]:
        """Ticks the sweeper after each gap until a tick launches nothing; returns the runs.

        Raises AssertionError if the sweeper still had new work after the last gap.
        """
        launched: list[Launch] = []
        for gap in gaps:
            self.clock.advance(gap)
            tick = self.sensor_tick()
            if not tick:
                return launched
            launched.extend(tick)
        raise AssertionError(f"the sweeper was still launching runs after {len(gaps)} ticks")

    def operator_rematerialise(self, period: Period) -> Launch:
        """What `Materialize` on the week's partition in the UI does: the whole job again."""
        return self._launch(
            "operator",
            period.partition_key,
            run_key=None,
            tags={"digest/trigger": "operator"},
        )

    def delivered(self) -> Counter[str]:
        """Messages the provider delivered, per idempotency key (one locked read of its record)."""
        return Counter(key for key, _, _ in self.mailer.deliveries)
