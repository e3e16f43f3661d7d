"""One structured log format for every service: `event=<name> key=<operation key> k=v …`.

Only operation keys, customer ids, periods, states, counts and short codes go in; never an
address, a name or digest content (design: the operation key is the trace). A line about one
work item (it has a `key`) goes to `item_log` (`digest_pipeline.items`), every other line to
`step_log` (`digest_pipeline.steps`): Dagster's run log takes only the second (`dagster.yaml`),
so a week of 100,000 customers, or of 100,000 failures, writes a few lines per step there, not
one per item; the ledger's attempts and audit log are the per-item record, and `digest`
commands print both loggers' lines on stderr.
"""

import logging
from collections.abc import MutableMapping
from typing import Any

#: the parent of both: a handler here (the CLI's, a test's) sees every line
logger = logging.getLogger("digest_pipeline")
item_logger = logging.getLogger("digest_pipeline.items")
step_logger = logging.getLogger("digest_pipeline.steps")


def _fmt(value: object) -> str:
    text = str(value)
    return f'"{text}"' if (" " in text or not text) else text


class EventLog(logging.LoggerAdapter[logging.Logger]):
    """A logger whose calls name an event and its fields: `log.info("released", key=k, reason=r)`.

    Every keyword is a field, written in the order given; a field that is None is left out.
    The line is built only when the level is enabled.
    """

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        parts = " ".join(f"{k}={_fmt(v)}" for k, v in kwargs.items() if v is not None)
        return f"event={msg} {parts}", {}


#: lines about one work item; each carries its `key`
item_log = EventLog(item_logger)
#: lines about a step, a run or a request: never one per item
step_log = EventLog(step_logger)
