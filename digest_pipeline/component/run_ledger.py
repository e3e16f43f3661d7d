"""Fail closed on the ledger: every step of a run opens exactly the ledger the run started with.

The first step to open a ledger records its identity (a random id kept in the ledger, and its
URL without the password) as run tags; every later step, in this process or another machine's,
refuses with one line when its settings resolve to another ledger, and never creates an empty
SQLite file in its working directory because `DIGEST_DATABASE_URL` was not passed to it.
"""

from collections.abc import Callable, Mapping
from datetime import datetime

import dagster as dg
from sqlalchemy import Engine

from digest_pipeline.adapters.sql.identity import ledger_id, missing_sqlite_file, shown_url
from digest_pipeline.component.run_settings import check_run_settings
from digest_pipeline.domain.errors import LedgerMismatch, RunSettingsMismatch

#: run tags naming the run's ledger: its id (authoritative) and its URL (for people)
LEDGER_ID_TAG = "digest/ledger_id"
LEDGER_URL_TAG = "digest/ledger"
#: the start of a refusal's line in the run's event log (`digest run` prints those lines)
REFUSED = "refused: "


def refuse_before_open(url: str, implicit: bool, recorded: Mapping[str, str]) -> None:
    """Raises LedgerMismatch when opening `url` could only reach the wrong ledger."""
    if LEDGER_ID_TAG not in recorded:
        return
    run_url = recorded.get(LEDGER_URL_TAG, "?")
    if implicit and shown_url(url) != run_url:
        raise LedgerMismatch(
            f"DIGEST_DATABASE_URL is not set in this process, but its run uses the ledger "
            f"{run_url}: refusing the implicit {shown_url(url)}"
        )
    if (path := missing_sqlite_file(url)) is not None:
        raise LedgerMismatch(
            f"the ledger file {path} does not exist here (DIGEST_DATABASE_URL={shown_url(url)}), "
            f"but its run uses the ledger {run_url}: refusing to create an empty one"
        )


def check_identity(url: str, found: str, recorded: Mapping[str, str]) -> None:
    """Raises LedgerMismatch when the opened ledger is not the run's."""
    expected = recorded.get(LEDGER_ID_TAG)
    if expected is not None and expected != found:
        raise LedgerMismatch(
            f"DIGEST_DATABASE_URL={shown_url(url)} is ledger {found}, but its run uses ledger "
            f"{expected} ({recorded.get(LEDGER_URL_TAG, '?')}): refusing"
        )


def open_run_ledger(
    context: dg.InitResourceContext,
    url: str,
    implicit: bool,
    open_engine: Callable[[str], Engine],
    now: datetime,
    env: Mapping[str, str],
) -> Engine:
    """Opens the run's ledger at `url`, recording or checking its identity on the run.

    It also checks the process's `DIGEST_*` settings against those the run was launched with
    (run_settings.py), after the ledger, so a wrong ledger is named as such first.
    """
    run, instance = context.run, context.instance
    # Read the tags afresh: an earlier step of this run may have recorded them since it began.
    fresh = instance.get_run_by_id(run.run_id) if run is not None and instance is not None else None
    recorded: Mapping[str, str] = fresh.tags if fresh is not None else {}
    try:
        refuse_before_open(url, implicit, recorded)
        engine = open_engine(url)
        try:
            found = ledger_id(engine, now)
            check_identity(url, found, recorded)
            check_run_settings(env, recorded)
        except BaseException:
            engine.dispose()
            raise
    except (LedgerMismatch, RunSettingsMismatch) as exc:
        # A Celery task's exception reaches the launcher without its cause (only Dagster's
        # "Error executing resource_fn"); the run's event log keeps the refusal's own line.
        if context.log is not None:
            context.log.error(f"{REFUSED}{exc}")
        raise
    if fresh is not None and instance is not None and LEDGER_ID_TAG not in recorded:
        instance.add_run_tags(fresh.run_id, {LEDGER_ID_TAG: found, LEDGER_URL_TAG: shown_url(url)})
    return engine
