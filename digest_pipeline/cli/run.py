"""`digest run`: materialise one period's partition of the whole asset graph, in this process.

It runs the same job, resources, checks and executor the schedule runs: `weekly_digest_job` as the
code location of `workspace.yaml` defines it, against the project's Dagster instance, so the run is
listed under that job in the UI with the location's job snapshot (`cli/workspace_job.py`). A
progress line is drawn from the ledger while it runs, and a summary table is printed at the end.
`--period latest` is resolved once, at the command's instant, and the period's delivery window is
checked at that same instant before anything is recorded.
"""

import argparse
import threading
from typing import Any

from digest_pipeline import wiring
from digest_pipeline.cli.context import (
    EXIT_FAILED,
    EXIT_OK,
    Context,
    UsageError,
    add_operator_argument,
    add_period_argument,
    parse_period,
    require_operator,
    require_reason,
    table,
)
from digest_pipeline.cli.durability import require_durable_ledger
from digest_pipeline.cli.files import read_input
from digest_pipeline.cli.secrets import require_link_settings
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.states import CLAIMABLE, DeliveryState
from digest_pipeline.instance import prepare_home, storage_block
from digest_pipeline.runtime.helpers import allow_forks_beside, between_forks
from digest_pipeline.services import period_gate
from digest_pipeline.services.metrics import period_metrics

JOB = "weekly_digest_job"
#: the code location the webserver loads; the run is made for its job, under its name
WORKSPACE = "workspace.yaml"
WIDTH = 30


def register(sub: Any) -> None:
    """Adds `digest run`."""
    p = sub.add_parser(
        "run",
        help="materialise one period's partition of the asset graph (safe to repeat)",
        description="Snapshot, content, work items, deliveries and cleanup for one period, with "
        "the asset checks, recorded in the project's Dagster instance (DAGSTER_HOME, default "
        ".digest/dagster_home). Re-running a period never sends a digest twice.",
    )
    add_period_argument(p)
    p.add_argument(
        "--deliver-late",
        action="store_true",
        help="send a missed week (its delivery window closed before any attempt): records an "
        "audited grant that opens a late window of DIGEST_LATE_WINDOW_SECONDS from now",
    )
    p.add_argument("--reason", help="why the week is sent late (required with --deliver-late)")
    add_operator_argument(p)
    p.set_defaults(handler=run_period)


def _check_window(ctx: Context, period: Period, args: argparse.Namespace) -> str | None:
    """Refuses a missed week or a needless grant (exit 2); returns a late grant's operator.

    It only reads, and runs before anything of the command is recorded (a secret's first
    fingerprint, a grant, the snapshot), so its refusal's line is true as it stands. It asks
    at `ctx.now()`, the instant `latest` was resolved at: the period and its window check never
    straddle midnight.
    """
    policy, now = ctx.settings.policy, ctx.now()
    if not args.deliver_late:
        # either one alone would be silently ignored: the run would not be the late run asked for
        for flag, given in (("--reason", args.reason), ("--operator", args.operator)):
            if given is not None:
                raise UsageError(f"{flag} is only used with --deliver-late")
        period_gate.require_deliverable(ctx.ledger, policy, period, now)
        return None
    if not (args.reason or "").strip():
        raise UsageError("--deliver-late needs --reason TEXT")
    if (why := period_gate.grant_refusal(policy, period, now)) is not None:
        raise UsageError(why)
    return require_operator(ctx, args.operator)


def _grant_late(ctx: Context, period: Period, operator: str, reason: str) -> None:
    """Records the operator's late grant, from the command's instant."""
    closes = period_gate.grant_late_delivery(
        ctx.ledger, ctx.settings.policy, period, ctx.now(), operator, require_reason(reason)
    )
    ctx.err.write(
        f"period {period}: late delivery granted by {operator} until {closes:%Y-%m-%d %H:%M} UTC\n"
    )


class Progress:
    """Redraws `[#####.....] recorded/eligible` from the ledger until stopped."""

    def __init__(self, ctx: Context, period: Period) -> None:
        self._ctx, self._period = ctx, period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        # it reads the ledger and draws only between forks, so a delivery step still forks its
        # helpers beside it (DIGEST_DELIVERY_PROCESSES)
        allow_forks_beside(self._thread)

    def __enter__(self) -> "Progress":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._draw()
        self._ctx.err.write("\n")

    def _loop(self) -> None:
        # Redrawing in place only makes sense on a terminal; a log file gets the final line.
        live = self._ctx.err.isatty()
        while not self._stop.wait(0.5):
            if live:
                with between_forks():
                    self._draw()

    def _draw(self) -> None:
        counts = self._ctx.ledger.state_counts(self._period)
        total = sum(counts.values())
        waiting = sum(counts.get(s, 0) for s in (*CLAIMABLE, DeliveryState.CLAIMED))
        done = total - waiting
        filled = WIDTH * done // total if total else 0
        bar = "#" * filled + "." * (WIDTH - filled)
        self._ctx.err.write(f"\r{self._period} [{bar}] {done}/{total} items recorded")
        self._ctx.err.flush()


def _require_project_file(ctx: Context, name: str) -> None:
    """Refuses a missing, unreadable or oversized project file, without Dagster's loader."""
    path = ctx.root / name
    if not path.is_file():
        raise UsageError(f"no {name} in {ctx.root}: run digest from the project folder")
    read_input(path, name)  # Dagster and `instance.prepare_home` read it whole


def run_period(ctx: Context, args: argparse.Namespace) -> int:
    """Materialises the period; exit 1 if the run or a blocking check failed."""
    ctx.creates_ledger = True
    period = parse_period(ctx, args.period)
    settings = ctx.settings  # a bad setting fails here, before anything runs
    ledger = ctx.ledger  # migrated before the progress line starts reading it
    # the shop's source and templates are checked here, as the run's resources would check them:
    # a bad mapping or template is one line and exit 2, not a run that fails at its start
    wiring.build_customer_source(settings, ctx.engine)
    wiring.build_composer(settings, ctx.clock)
    _require_project_file(ctx, "dagster.yaml")
    _require_project_file(ctx, WORKSPACE)
    storage_block(ctx.env)  # a bad DAGSTER_PG_* setting, refused as `prepare_home` would
    require_reason(args.reason)  # a bad --reason is bad input before any refusal of the ledger
    # the window, before the secret check below may record the secret's first fingerprint
    operator = _check_window(ctx, period, args)
    # a ledger that can lose commits would send twice after a crash (cli/durability.py)
    require_durable_ledger(ctx, "digest run")
    # Imported only now, after every refusal of the command line and the project files: loading
    # Dagster takes seconds that bad input must not wait for (cli/test_no_dagster_before_refusal).
    import dagster as dg

    from digest_pipeline.cli.instances import default_spec
    from digest_pipeline.cli.workspace_job import (
        execute_workspace_job,
        failure_lines,
        workspace_origin,
    )
    from digest_pipeline.component.guards import REFUSED_TAG
    from digest_pipeline.component.partitions import require_partition
    from digest_pipeline.component.run_ledger import REFUSED

    # what workspace.yaml names, which only Dagster's own loader reads; still before anything
    # of the command is recorded
    workspace_origin(ctx.root / WORKSPACE)
    # a week before the job's first week (DIGEST_FIRST_WEEK) is no partition: one line, and
    # no late grant recorded for it
    digest = args.digest or default_spec()
    require_partition(period, digest.partitions)
    # the demo's secret and loopback link, no postal address: demo ledger only (cli/secrets.py)
    require_link_settings(ctx, "digest run")
    # last of the checks: a late grant is recorded only when the run can start right after it
    if operator is not None:
        _grant_late(ctx, period, operator, args.reason)
    home = prepare_home(ctx.root, ctx.env)
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        with Progress(ctx, period):
            # the job as the workspace's code location defines it, so the run is listed under it
            result = execute_workspace_job(
                instance,
                ctx.root / WORKSPACE,
                digest.names.named(JOB),
                period.partition_key,
                # the full event log goes to the instance (and the UI); the terminal gets the bar
                run_config={"loggers": {"console": {"config": {"log_level": "ERROR"}}}},
            )
        checks = result.get_asset_check_evaluations()
        # a refused week's run ends without error having done nothing: its tag says why
        run = instance.get_run_by_id(result.run_id)
        refusal = run.tags.get(REFUSED_TAG) if run is not None else None
        succeeded = result.success and refusal is None
        failures = [] if succeeded else failure_lines(instance, result.run_id, REFUSED)
    finally:
        instance.dispose()
    metrics = period_metrics(ledger, period, ctx.clock.now())
    outcome = "succeeded" if succeeded else "REFUSED" if result.success else "FAILED"
    ctx.write(f"period {period}: run {result.run_id} {outcome}")
    for line in failures:
        ctx.write(f"  {line}")
    ctx.write()
    table(ctx, sorted(metrics.by_state.items()), ("state", "items"))
    ctx.write()
    table(
        ctx,
        sorted(
            (c.check_name, "pass" if c.passed else f"FAIL ({c.severity.value})") for c in checks
        ),
        ("check", "result"),
    )
    ctx.write()
    if settings.mailer == "outbox":
        ctx.write(f"messages: {settings.outbox_dir}/new (one .eml file per operation key)")
    ctx.write(f"inspect: make ui, then http://127.0.0.1:3000 (DAGSTER_HOME={home})")
    return EXIT_OK if succeeded else EXIT_FAILED
