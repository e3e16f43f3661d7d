"""Fail closed on settings: every step runs with the `DIGEST_*` settings its run launched with.

The process that orchestrates a run (its executor) records a mark of each `DIGEST_*` variable
it has as a run tag; a step process (a Celery worker, a Kubernetes pod, a multiprocess child)
whose variables differ refuses with one line naming them, instead of, say, "delivering" into a
local outbox because `DIGEST_MAILER` was not passed to it. Marks are digests, never values, and
a secret only counts as present or absent. `DIGEST_DATABASE_URL` is compared by the ledger's own
identity instead (run_ledger.py), since one ledger can be reached by several URLs.
"""

import hashlib
import json
import re
from collections.abc import Mapping

from digest_pipeline.domain.errors import RunSettingsMismatch

#: the run tag holding `{variable: mark}` for the launcher's `DIGEST_*` variables
RUN_SETTINGS_TAG = "digest/settings"
#: variables a step never reads (the CLI's), or that are checked another way (the ledger's URL)
UNCOMPARED = frozenset({"DIGEST_DATABASE_URL", "DIGEST_OPERATORS", "DIGEST_LOG_LEVEL"})
_SECRET = ("_PASSWORD", "_API_KEY", "_SECRET")
_URL_PASSWORD = re.compile(r"(//[^:/@]*):[^@/]*@")


def _mark(name: str, value: str) -> str:
    if name.endswith(_SECRET):
        return "set"
    if name.endswith("_URL"):
        value = _URL_PASSWORD.sub(r"\1:***@", value)
    return hashlib.sha256(value.encode()).hexdigest()[:12]


def settings_marks(env: Mapping[str, str]) -> dict[str, str]:
    """A mark per `DIGEST_*` variable set in `env` (blank counts as unset, as settings read it)."""
    return {
        name: _mark(name, value.strip())
        for name, value in env.items()
        if name.startswith("DIGEST_")
        and not name.startswith("DIGEST_TEST_")
        and name not in UNCOMPARED
        and value.strip()
    }


def run_settings_tag(env: Mapping[str, str]) -> dict[str, str]:
    """The run tag recording `env`'s marks."""
    return {RUN_SETTINGS_TAG: json.dumps(settings_marks(env), sort_keys=True)}


def check_run_settings(env: Mapping[str, str], recorded: Mapping[str, str]) -> None:
    """Raises RunSettingsMismatch when `env` is not the run's recorded settings."""
    raw = recorded.get(RUN_SETTINGS_TAG)
    if raw is None:
        return
    run, here = json.loads(raw), settings_marks(env)
    problems = [
        f"{name} is not set here"
        if name not in here
        else f"{name} is set here but not in the run"
        if name not in run
        else f"{name} differs"
        for name in sorted(run.keys() | here.keys())
        if run.get(name) != here.get(name)
    ]
    if problems:
        raise RunSettingsMismatch(
            f"this process's DIGEST_* settings are not its run's ({'; '.join(problems)}): "
            "refusing; give every step process the variables its run was launched with"
        )
