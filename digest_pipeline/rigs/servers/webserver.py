"""One real week on a SQLite ledger, and the real Dagster webserver on loopback.

`seed_week` seeds demo source data into a fresh SQLite ledger and returns the `DIGEST_*`
environment that points the project's resources at it; the webserver subprocess gets the same
environment, so it sees the same ledger and outbox. (Running the job in-process needs the
definitions, a face above the rigs: the tests' `weekly_job.materialize_week` does that.)

`running_webserver` starts `dagster-webserver` on 127.0.0.1 with the project's `workspace.yaml`,
waits until it answers, and always stops it (and the code server it spawned) afterwards. With
`dev=True` it starts `dagster dev` instead, what `make ui` runs: the webserver plus the daemon,
which dequeues launched runs (the project's `dagster.yaml` uses the QueuedRunCoordinator, so
a run launched from a webserver without a daemon would stay queued) and starts each in a
subprocess through the DefaultRunLauncher. `launch_partition`, `wait_for_run`, `job_runs` and
`location_snapshot_id` ask the GraphQL the UI asks to launch a week and to list a job's runs.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from digest_pipeline.adapters.demo_data import seed_demo
from digest_pipeline.rigs.bootstrap import PROJECT_ROOT, open_rig_ledger
from digest_pipeline.rigs.seeding import T0, W42
from digest_pipeline.rigs.servers.loopback import free_port

PARTITION = W42.partition_key  # "2026-W42-1"
JOB = "weekly_digest_job"
ASSETS = (
    "eligibility_snapshot",
    "digest_content",
    "digest_work_items",
    "digest_deliveries",
    "digest_cleanup",
)
CUSTOMERS = 30
SEED = 3
#: the venv's console scripts, next to the interpreter running the tests
WEBSERVER = Path(sys.executable).with_name("dagster-webserver")
DAGSTER = Path(sys.executable).with_name("dagster")
DIGEST = Path(sys.executable).with_name("digest")
#: the code location as `workspace.yaml` names it, and the repository `@dg.definitions` makes
LOCATION = "digest_pipeline"
REPOSITORY = "__repository__"
TERMINAL = ("SUCCESS", "FAILURE", "CANCELED")


def seed_week(folder: Path) -> dict[str, str]:
    """Seeds 2026-W42's source data into `folder/ledger.db`; returns the run's `DIGEST_*` env."""
    folder.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{folder / 'ledger.db'}"
    with open_rig_ledger(url) as ledger:
        # as of Monday 06:00 after W42: orders in the weeks before, new arrivals inside W42
        seed_demo(ledger.engine, customers=CUSTOMERS, seed=SEED, now=T0)
    # The resources run on the real clock (SystemClock), and by default the delivery window of
    # a week closes three days after it ends, so a run of this fixed, past week today would
    # dead-letter every item `window_closed`. Keep W42's window open until a day after now,
    # rather than running "the latest week": that keeps the partition key and the seeded data
    # the same whatever day the test runs on.
    window = datetime.now(UTC) + timedelta(days=1) - W42.ends_at
    return {
        "DIGEST_DATABASE_URL": url,
        "DIGEST_OUTBOX_DIR": str(folder / "outbox"),
        "DIGEST_MAILER": "outbox",
        "DIGEST_DELIVERY_WINDOW_SECONDS": str(int(window.total_seconds())),
        # The seeded ledger holds no week yet, so the partitions would start at the latest
        # complete week, after W42: start them at W42, the install's first week.
        "DIGEST_FIRST_WEEK": str(W42),
    }


def _digest(
    env: Mapping[str, str], timeout: float, *argv: str
) -> "subprocess.CompletedProcess[str]":
    """The real `digest` console script, run from the project folder with `env` only."""
    return subprocess.run(
        [str(DIGEST), *argv],
        cwd=PROJECT_ROOT,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def digest_run(env: Mapping[str, str], period: str, timeout: float = 300) -> str:
    """Runs the real `digest run --period P` console script from the project folder.

    Returns the run id it printed; AssertionError, with its output, unless it exits 0.
    """
    done = _digest(env, timeout, "run", "--period", period)
    assert done.returncode == 0, done.stdout + done.stderr
    first = done.stdout.splitlines()[0]  # "period 2026-W42: run <run id> succeeded"
    assert first.endswith(" succeeded"), done.stdout
    return first.split(" run ", 1)[1].split()[0]


@dataclass
class Webserver:
    """A running webserver: its base URL and a client for the UI's GraphQL endpoint."""

    url: str
    client: httpx.Client

    def graphql(self, query: str, variables: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """POSTs one query to `/graphql`; returns `data`, failing on any GraphQL error."""
        response = self.client.post(
            f"{self.url}/graphql", json={"query": query, "variables": dict(variables or {})}
        )
        response.raise_for_status()
        body = response.json()
        assert not body.get("errors"), body["errors"]
        data: dict[str, Any] = body["data"]
        return data


class WebserverDied(RuntimeError):
    """The webserver exited (or never answered) before it was up."""


def _log_tail(path: Path, limit: int = 6000) -> str:
    text = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
    return text[-limit:]


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member we may not signal still exists
        return True
    return True


def _stop(proc: "subprocess.Popen[bytes]", timeout: float) -> None:
    """SIGTERM the webserver, then SIGKILL its process group (it and its code server) if needed.

    The group is the one `start_new_session` made for this webserver alone.
    """
    pgid = proc.pid
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            proc.wait(timeout=timeout)
    # The code server notices its parent is gone and exits by itself; give it a moment.
    deadline = time.monotonic() + timeout
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _group_alive(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


def _wait_until_up(
    proc: "subprocess.Popen[bytes]", client: httpx.Client, url: str, log: Path, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise WebserverDied(
                f"dagster-webserver exited with {proc.returncode} before it was up:\n"
                + _log_tail(log)
            )
        try:
            if client.get(f"{url}/server_info", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise WebserverDied(f"dagster-webserver did not answer within {timeout} s:\n" + _log_tail(log))


def _command(port: int, dev: bool) -> list[str]:
    workspace = ("-w", str(PROJECT_ROOT / "workspace.yaml"))
    if dev:
        return [str(DAGSTER), "dev", "-h", "127.0.0.1", "-p", str(port), *workspace]
    return [str(WEBSERVER), "-h", "127.0.0.1", "-p", str(port), *workspace, "--read-only"]


@contextlib.contextmanager
def running_webserver(
    env: Mapping[str, str],
    logs: Path,
    *,
    dev: bool = False,
    startup_timeout: float = 60,
    stop_timeout: float = 10,
) -> Iterator[Webserver]:
    """Runs `dagster-webserver -w workspace.yaml --read-only` on a free loopback port.

    `dev=True` runs `dagster dev -w workspace.yaml` (webserver and daemon, able to launch runs)
    instead; its SIGTERM is a graceful shutdown of both, so give it a longer `stop_timeout`.
    `env` is the whole environment of the server (DAGSTER_HOME and `DIGEST_*` included); its
    stdout and stderr go to `logs/webserver.log`, which a start-up failure quotes.
    """
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / "webserver.log"
    for attempt in range(3):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with log.open("wb") as out, httpx.Client(timeout=30) as client:
            proc = subprocess.Popen(
                _command(port, dev),
                cwd=PROJECT_ROOT,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                try:
                    _wait_until_up(proc, client, url, log, startup_timeout)
                except WebserverDied:
                    # another process may have taken the port between the probe and the bind
                    if attempt < 2 and "address already in use" in _log_tail(log).lower():
                        continue
                    raise
                yield Webserver(url, client)
                return
            finally:
                _stop(proc, stop_timeout)
    raise AssertionError("unreachable")  # pragma: no cover


def job_selector(job: str = JOB) -> dict[str, str]:
    """The UI's PipelineSelector for a job of the project's code location."""
    return {"pipelineName": job, "repositoryName": REPOSITORY, "repositoryLocationName": LOCATION}


ASSET_NODES = """
query JobAssetNodes($pipeline: PipelineSelector!) {
  assetNodes(pipeline: $pipeline) {
    assetKey { path }
    assetChecksOrError { ... on AssetChecks { checks { name } } }
  }
}
"""

#: the UI's LaunchPipelineExecution mutation (LaunchRootExecutionButton), with the error cases
LAUNCH = """
mutation LaunchPipelineExecution($executionParams: ExecutionParams!) {
  launchPipelineExecution(executionParams: $executionParams) {
    __typename
    ... on LaunchRunSuccess { run { id pipelineName } }
    ... on PipelineNotFoundError { message }
    ... on InvalidSubsetError { message }
    ... on RunConfigValidationInvalid { errors { message } }
    ... on PythonError { message }
    ... on UnauthorizedError { message }
  }
}
"""

RUN = """
query RunStatus($runId: ID!) {
  runOrError(runId: $runId) {
    __typename
    ... on Run {
      id status startTime endTime pipelineName pipelineSnapshotId parentPipelineSnapshotId
      tags { key value }
    }
  }
}
"""

RUN_MESSAGES = """
query RunMessages($runId: ID!) {
  logsForRun(runId: $runId, limit: 100000) {
    __typename
    ... on EventConnection { events { __typename ... on MessageEvent { message } } }
  }
}
"""

#: the job's Runs tab asks for the job's runs tagged with its repository (`.dagster/repository`)
JOB_RUNS = """
query JobRuns($filter: RunsFilter!) {
  runsOrError(filter: $filter) {
    __typename
    ... on Runs {
      results {
        runId status pipelineName pipelineSnapshotId
        repositoryOrigin { repositoryName repositoryLocationName }
        tags { key value }
      }
    }
  }
}
"""

LOCATION_JOB = """
query LocationJob($params: PipelineSelector!) {
  pipelineOrError(params: $params) {
    __typename
    ... on Pipeline { name pipelineSnapshotId }
  }
}
"""


def launch_partition(
    server: Webserver,
    partition: str,
    *,
    job: str = JOB,
    run_config: Mapping[str, Any] | None = None,
) -> str:
    """Launches one partition of the job's whole asset selection as "Materialize all" does.

    The UI sends the job's selector with every asset and check of the job, the partition as the
    `dagster/partition` tag, mode `default` and the launchpad's run config (`{}` by default);
    returns the new run's id.
    """
    nodes = server.graphql(ASSET_NODES, {"pipeline": job_selector(job)})["assetNodes"]
    params = {
        "mode": "default",
        # the launchpad sends its YAML editor's text; JSON is YAML
        "runConfigData": json.dumps(dict(run_config or {})),
        "executionMetadata": {"tags": [{"key": "dagster/partition", "value": partition}]},
        "selector": {
            **job_selector(job),
            "assetSelection": [{"path": n["assetKey"]["path"]} for n in nodes],
            "assetCheckSelection": [
                {"assetKey": {"path": n["assetKey"]["path"]}, "name": c["name"]}
                for n in nodes
                for c in n["assetChecksOrError"]["checks"]
            ],
        },
    }
    result = server.graphql(LAUNCH, {"executionParams": params})["launchPipelineExecution"]
    assert result["__typename"] == "LaunchRunSuccess", result
    run_id: str = result["run"]["id"]
    return run_id


def wait_for_run(server: Webserver, run_id: str, timeout: float) -> dict[str, Any]:
    """Polls the run until it is SUCCESS, FAILURE or CANCELED; returns it.

    AssertionError if it is still going after `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        run: dict[str, Any] = server.graphql(RUN, {"runId": run_id})["runOrError"]
        if run.get("status") in TERMINAL:
            return run
        if time.monotonic() > deadline:
            raise AssertionError(f"run {run_id} still {run.get('status')} after {timeout} s")
        time.sleep(0.5)


def run_messages(server: Webserver, run_id: str) -> list[str]:
    """The messages of the run's event log."""
    logs = server.graphql(RUN_MESSAGES, {"runId": run_id})["logsForRun"]
    return [e["message"] for e in logs["events"] if e.get("message")]


def job_runs(server: Webserver, job: str = JOB) -> list[dict[str, Any]]:
    """The runs the job's Runs tab lists: by job name and the `.dagster/repository` tag."""
    tag = {"key": ".dagster/repository", "value": f"{REPOSITORY}@{LOCATION}"}
    runs = server.graphql(JOB_RUNS, {"filter": {"pipelineName": job, "tags": [tag]}})
    results: list[dict[str, Any]] = runs["runsOrError"]["results"]
    return results


def location_snapshot_id(server: Webserver, job: str = JOB) -> str:
    """The job snapshot id the served code location reports for the job."""
    found = server.graphql(LOCATION_JOB, {"params": job_selector(job)})["pipelineOrError"]
    assert found["__typename"] == "Pipeline", found
    snapshot_id: str = found["pipelineSnapshotId"]
    return snapshot_id


SET_NUX_SEEN = "mutation SetNuxSeen { setNuxSeen }"


def dismiss_community_nux(server: Webserver) -> None:
    """Marks the UI's "Join the Dagster community" dialog seen, as its Skip button does.

    The UI opens it over every page it serves on a loopback origin until the instance records it
    seen (`$DAGSTER_HOME/.nux`), so a browser's screenshots would show the dialog, not the page.
    """
    assert server.graphql(SET_NUX_SEEN)["setNuxSeen"] is True


def asset_checks(server: Webserver, job: str = JOB) -> dict[str, list[str]]:
    """Each asset of the job (by its key's last part) with the names of its checks."""
    nodes = server.graphql(ASSET_NODES, {"pipeline": job_selector(job)})["assetNodes"]
    return {
        n["assetKey"]["path"][-1]: [c["name"] for c in n["assetChecksOrError"]["checks"]]
        for n in nodes
    }


#: the UI's AssetCheckPartitionDetailQuery: one check's executions for one partition
CHECK_EXECUTIONS = """
query CheckExecutions($assetKey: AssetKeyInput!, $checkName: String!, $partition: String!) {
  assetCheckExecutions(
    assetKey: $assetKey, checkName: $checkName, partition: $partition, limit: 1000
  ) {
    runId
    status
    partition
    evaluation { success severity partition description }
  }
}
"""


def check_executions(
    server: Webserver, asset: str, check: str, partition: str
) -> list[dict[str, Any]]:
    """The check's executions for the partition, newest first (`status`: SUCCEEDED, FAILED, …)."""
    found: list[dict[str, Any]] = server.graphql(
        CHECK_EXECUTIONS,
        {"assetKey": {"path": [asset]}, "checkName": check, "partition": partition},
    )["assetCheckExecutions"]
    return found


OBSERVATIONS = """
query Observations($assetKey: AssetKeyInput!, $partitions: [String!]) {
  assetOrError(assetKey: $assetKey) {
    __typename
    ... on Asset {
      assetObservations(partitions: $partitions) {
        runId
        partition
        metadataEntries { label ... on TextMetadataEntry { text } }
      }
    }
  }
}
"""


def asset_observations(server: Webserver, asset: str, partition: str) -> list[dict[str, Any]]:
    """The asset's observations of the partition, newest first: run id and text metadata."""
    found = server.graphql(OBSERVATIONS, {"assetKey": {"path": [asset]}, "partitions": [partition]})
    return [
        {
            "runId": o["runId"],
            "partition": o["partition"],
            "metadata": {e["label"]: e.get("text") for e in o["metadataEntries"]},
        }
        for o in found["assetOrError"]["assetObservations"]
    ]


def digest_status(env: Mapping[str, str], period: str, timeout: float = 120) -> dict[str, Any]:
    """Runs the real `digest status --period P --json` from the project folder; returns its JSON.

    Exit 1 (an invariant fails) still prints the JSON; AssertionError, with its output, on any
    other exit code.
    """
    done = _digest(env, timeout, "status", "--period", period, "--json")
    assert done.returncode in (0, 1), done.stdout + done.stderr
    status: dict[str, Any] = json.loads(done.stdout)
    return status
