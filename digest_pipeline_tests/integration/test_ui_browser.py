"""What a person reads of a week in the web UI, in a real browser, agrees with `digest status`.

Headless Debian Chromium, driven through chromedriver (`digest_pipeline.rigs.servers.browser`),
opens the real webserver's pages on loopback and reads their DOM, never their pixels; every page
is saved as a screenshot under the scenario's temporary folder (`shots/`). Two scenarios, each
set up once for the module: 2026-W42 delivered and then re-run by `digest run`, whose five
partition pages and invariant checks must show what `digest status --json` says of the week;
and 2026-W40, whose delivery window closed with nothing recorded, launched from the job's page:
it is refused, and the UI must say why without showing any check as failed.
"""

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from digest_pipeline.component.guards import REFUSED_TAG
from digest_pipeline.domain.periods import Period
from digest_pipeline.domain.states import DeliveryState
from digest_pipeline.instance import prepare_home
from digest_pipeline.rigs.bootstrap import PROJECT_ROOT
from digest_pipeline.rigs.servers.browser import (
    Page,
    ShownEvent,
    find_chromedriver,
    find_chromium,
    headless_chromium,
    launch_partition_by_clicking,
    read_check_partition,
    read_latest_event,
    read_partition,
    read_run_tags,
)
from digest_pipeline.rigs.servers.webserver import (
    ASSETS,
    JOB,
    LOCATION,
    Webserver,
    asset_checks,
    asset_observations,
    check_executions,
    digest_run,
    digest_status,
    dismiss_community_nux,
    running_webserver,
    seed_week,
    wait_for_run,
)
from digest_pipeline_tests.conftest import hermetic_environ, require_tool

# seeding, two `digest run`s, a webserver start and some twenty pages on a loaded 2-core box
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

W42 = Period.parse("2026-W42")
#: `seed_week` keeps W42's delivery window open until a day from now: W40's, two weeks earlier,
#: closed before anything of it was recorded
W40 = Period.parse("2026-W40")
#: the ledger invariants `digest status` evaluates, each an asset check of one of the five assets
INVARIANTS = (
    "snapshot_unchanged",
    "no_silent_timeout",
    "every_customer_has_visible_state",
    "no_duplicate_send",
    "at_most_one_cleanup_per_key",
)
#: the check status the UI shows for a passed evaluation
PASSED = "Passed"
#: check statuses that say a check failed, or could not be evaluated
FAILED_SHOWN = {"Failed", "Execution failed"}
FAILED_EXECUTIONS = {"FAILED", "EXECUTION_FAILED"}
#: what the UI prints for a metadata value that is JSON null: a NullMetadataEntry reads "null";
#: "-" and an empty cell are how a table says "no value". A label the UI leaves out is not
#: compared at all (the contract compares the labels both sides show).
NULL_SHOWN = {"null", "None", "-", ""}
#: thousands separators the UI may print in an int (`1,234`, or a locale's spaces)
SEPARATORS = re.compile(r"[,\u00a0\u202f ]")


def browser_tools() -> tuple[Path, Path]:
    """Debian's chromium and chromedriver; skip (locally) or fail (CI=true) without either."""
    chromium = require_tool(find_chromium(), "chromium", "chromium")
    chromedriver = require_tool(find_chromedriver(), "chromedriver", "chromium-driver")
    return chromium, chromedriver


def week_env(tmp: Path) -> dict[str, str]:
    """A seeded ledger and a fresh DAGSTER_HOME, as the environment of every process."""
    seeded = seed_week(tmp / "ledger")
    home = prepare_home(PROJECT_ROOT, {}, tmp / "home")
    return {**hermetic_environ(), **seeded, "DAGSTER_HOME": str(home)}


def number(shown: str) -> float | None:
    """The number the UI printed, its thousands separators dropped; None if it is not one."""
    try:
        return float(SEPARATORS.sub("", shown))
    except ValueError:
        return None


def shown_as(shown: str, expected: Any) -> bool:
    """Whether the UI's text shows the JSON value: numbers numerically, null as NULL_SHOWN.

    Floats compare as printed (the UI prints JavaScript's shortest form: `1` for 1.0).
    """
    if expected is None:
        return shown in NULL_SHOWN
    if isinstance(expected, bool):
        return shown.lower() == str(expected).lower()
    if isinstance(expected, int | float):
        value = number(shown)
        return value is not None and math.isclose(value, expected, rel_tol=1e-9, abs_tol=1e-12)
    return bool(shown == str(expected))


def owners(checks: dict[str, list[str]]) -> dict[str, str]:
    """Each check of the five assets → its asset."""
    return {check: asset for asset in ASSETS for check in checks.get(asset, [])}


@dataclass(frozen=True)
class RerunWeek:
    """W42 delivered, re-run, and read: from the UI's pages and from `digest status --json`."""

    rerun_id: str
    #: asset → its partition page's latest materialisation
    pages: dict[str, ShownEvent]
    #: invariant → the status its check's Partitions tab shows for the partition ("" if no check)
    checks: dict[str, str]
    status: dict[str, Any]
    shots: Path


@pytest.fixture(scope="module")
def rerun_week(tmp_path_factory: pytest.TempPathFactory) -> RerunWeek:
    chromium, chromedriver = browser_tools()
    tmp = tmp_path_factory.mktemp("ui-browser-rerun")
    env = week_env(tmp)
    digest_run(env, str(W42))
    rerun_id = digest_run(env, str(W42))  # a re-run of a delivered week
    key = W42.partition_key
    with (
        running_webserver(env, tmp / "logs") as server,
        headless_chromium(chromium, chromedriver, tmp / "browser") as page,
    ):
        dismiss_community_nux(server)
        pages = {}
        for asset in ASSETS:
            pages[asset] = read_partition(page, server.url, asset, key)
            page.screenshot(f"partition-{asset}")
        owner = owners(asset_checks(server))
        checks = {}
        for name in INVARIANTS:
            if name in owner:
                checks[name] = read_check_partition(page, server.url, owner[name], name, key)
                page.screenshot(f"check-{name}")
            else:
                checks[name] = ""
    return RerunWeek(rerun_id, pages, checks, digest_status(env, str(W42)), page.shots)


def test_every_partition_page_shows_the_reruns_materialisation(rerun_week: RerunWeek) -> None:
    shown = {asset: p.run_id for asset, p in rerun_week.pages.items()}
    assert shown == dict.fromkeys(ASSETS, rerun_week.rerun_id), rerun_week.shots
    assert all(p.metadata for p in rerun_week.pages.values()), rerun_week.shots


def test_the_ui_metadata_shows_what_digest_status_says(rerun_week: RerunWeek) -> None:
    metrics = rerun_week.status["metrics"]
    compared = []
    mismatches = []
    for asset, page in rerun_week.pages.items():
        for label, shown in page.metadata.items():
            # a list or object shows as a "[Show JSON]" link in the table: not comparable there
            if label not in metrics or isinstance(metrics[label], list | dict):
                continue
            compared.append(f"{asset}.{label}")
            if not shown_as(shown, metrics[label]):
                mismatches.append(f"{asset}.{label}: UI {shown!r}, status {metrics[label]!r}")
    assert compared, "no metadata label of the five assets is a status metric"
    assert mismatches == [], f"UI vs `digest status --json` (screenshots: {rerun_week.shots})"


def test_an_invariant_check_passes_in_the_ui_exactly_when_digest_status_says_so(
    rerun_week: RerunWeek,
) -> None:
    invariants = rerun_week.status["invariants"]
    assert set(INVARIANTS) <= set(invariants), sorted(invariants)
    shown = {name: rerun_week.checks[name] for name in INVARIANTS}
    assert all(shown.values()), f"invariants with no check on the five assets: {shown}"
    expected = {name: invariants[name]["passed"] for name in INVARIANTS}
    assert {name: status == PASSED for name, status in shown.items()} == expected, shown


def test_deliveries_show_every_state_adding_up_to_eligible_and_not_zero_after_a_rerun(
    rerun_week: RerunWeek,
) -> None:
    shown = rerun_week.pages["digest_deliveries"].metadata
    missing = [s.value for s in DeliveryState if s.value not in shown]
    assert missing == [], f"states the deliveries page does not show: {missing}"
    counts = {s.value: number(shown[s.value]) for s in DeliveryState}
    eligible = number(shown["eligible"])
    assert eligible, shown.get("eligible")
    assert sum(n or 0 for n in counts.values()) == eligible, counts
    # a re-run of a delivered week sends and cleans nothing itself: the week's numbers must not
    # turn into the run's own zeros
    assert (counts["sent"] or 0) + (counts["cleaned"] or 0) > 0, counts


def test_content_shows_the_weeks_totals_not_the_reruns_zeros(rerun_week: RerunWeek) -> None:
    metrics = rerun_week.status["metrics"]
    shown = rerun_week.pages["digest_content"].metadata
    totals = {
        label: number(text)
        for label, text in shown.items()
        if isinstance(metrics.get(label), int | float) and not isinstance(metrics[label], bool)
    }
    assert totals, (
        f"no count on digest_content is a `digest status` metric: UI {sorted(shown)}, "
        f"status {sorted(metrics)}"
    )
    # a clean week has nothing missing, so one total may rightly be 0; the re-run's own counts
    # would make every one 0
    assert any(totals.values()), totals


@dataclass(frozen=True)
class RefusedWeek:
    """W40 launched from the job's page, refused, and read from the UI's pages and GraphQL."""

    run: dict[str, Any]
    #: the run's tags as its "View tags and config" dialog lists them
    run_tags: dict[str, str]
    #: (asset, check) → the status its Partitions tab shows for W40
    shown_checks: dict[tuple[str, str], str]
    #: (asset, check) → the statuses of its executions for W40
    executions: dict[tuple[str, str], list[str]]
    #: the newest event of eligibility_snapshot's W40 partition, on its Events tab
    event: ShownEvent
    observations: list[dict[str, Any]]
    shots: Path

    @property
    def graphql_tags(self) -> dict[str, str]:
        return {t["key"]: t["value"] for t in self.run["tags"]}


def _read_refused_week(server: Webserver, page: Page, key: str) -> RefusedWeek:
    run_id = launch_partition_by_clicking(page, server.url, LOCATION, JOB, key)
    run = wait_for_run(server, run_id, timeout=300)
    for asset in ASSETS:
        read_partition(page, server.url, asset, key)
        page.screenshot(f"partition-{asset}")
    run_tags = read_run_tags(page, server.url, run_id, "run")
    event = read_latest_event(page, server.url, "eligibility_snapshot", key)
    page.screenshot("events-eligibility_snapshot")
    shown_checks = {}
    executions = {}
    for asset, checks in asset_checks(server).items():
        if asset not in ASSETS:
            continue
        for check in checks:
            shown_checks[asset, check] = read_check_partition(page, server.url, asset, check, key)
            page.screenshot(f"check-{asset}-{check}")
            executions[asset, check] = [
                e["status"] for e in check_executions(server, asset, check, key)
            ]
    observations = asset_observations(server, "eligibility_snapshot", key)
    return RefusedWeek(run, run_tags, shown_checks, executions, event, observations, page.shots)


@pytest.fixture(scope="module")
def refused_week(tmp_path_factory: pytest.TempPathFactory) -> RefusedWeek:
    chromium, chromedriver = browser_tools()
    tmp = tmp_path_factory.mktemp("ui-browser-refused")
    # W40 must be a partition: by default the first one is the ledger's earliest week
    env = {**week_env(tmp), "DIGEST_FIRST_WEEK": str(W40)}
    # `dagster dev`: its daemon dequeues the launched run
    with (
        running_webserver(env, tmp / "logs", dev=True, stop_timeout=60) as server,
        headless_chromium(chromium, chromedriver, tmp / "browser") as page,
    ):
        dismiss_community_nux(server)
        return _read_refused_week(server, page, W40.partition_key)


def refusal_line(week: RefusedWeek) -> str:
    """The run's `digest/refused` tag (GraphQL), which must name the period."""
    line = week.graphql_tags.get(REFUSED_TAG)
    assert line, f"run {week.run['id']} ({week.run['status']}) has no {REFUSED_TAG} tag"
    assert str(W40) in line, line
    return line


def test_the_refused_run_carries_the_refusal_line_as_a_tag(refused_week: RefusedWeek) -> None:
    line = refusal_line(refused_week)
    assert refused_week.run_tags.get(REFUSED_TAG) == line, refused_week.run_tags


def test_no_check_of_the_refused_partition_shows_as_failed(refused_week: RefusedWeek) -> None:
    assert refused_week.shown_checks, "the five assets show no checks"
    shown_failed = {
        f"{asset}.{check}": status
        for (asset, check), status in refused_week.shown_checks.items()
        if status in FAILED_SHOWN
    }
    assert shown_failed == {}, f"screenshots: {refused_week.shots}"
    executed_failed = {
        f"{asset}.{check}": statuses
        for (asset, check), statuses in refused_week.executions.items()
        if FAILED_EXECUTIONS & set(statuses)
    }
    assert executed_failed == {}


def test_the_refused_partition_of_the_snapshot_observes_the_refusal_line(
    refused_week: RefusedWeek,
) -> None:
    line = refusal_line(refused_week)
    run_id = refused_week.run["id"]
    observed = [o for o in refused_week.observations if o["runId"] == run_id]
    assert [o["metadata"].get("refused") for o in observed] == [line], refused_week.observations
    event = refused_week.event
    assert (event.run_id, event.metadata.get("refused")) == (run_id, line), event
    assert " observed in run " in event.heading, event.heading
