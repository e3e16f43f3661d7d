"""One structured log format for every service: `event=<name> key=<operation key> k=v …`.

Only operation keys, customer ids, periods, states, counts and short codes go in; never an
address, a name or digest content (design: the operation key is the trace). A line about one
work item (it has a `key`) goes to `digest_pipeline.items`, every other line to
`digest_pipeline.steps`: Dagster's run log takes only the second (`dagster.yaml`), so a week
of 100,000 customers, or of 100,000 failures, writes a few lines per step there, not one per
item; the ledger's attempts and audit log are the per-item record, and `digest` commands print
both loggers' lines on stderr.
"""

import logging

#: the parent of both: a handler here (the CLI's, a test's) sees every line
logger = logging.getLogger("digest_pipeline")
item_logger = logging.getLogger("digest_pipeline.items")
step_logger = logging.getLogger("digest_pipeline.steps")


def _fmt(value: object) -> str:
    text = str(value)
    return f'"{text}"' if (" " in text or not text) else text


def log_event(event: str, level: int = logging.INFO, **fields: object) -> None:
    """Logs `event=<event>` followed by the fields in the order given."""
    target = item_logger if fields.get("key") is not None else step_logger
    if target.isEnabledFor(level):
        parts = " ".join(f"{k}={_fmt(v)}" for k, v in fields.items() if v is not None)
        target.log(level, "event=%s %s", event, parts)
