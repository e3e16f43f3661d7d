"""One structured log format for every service: `event=<name> key=<operation key> k=v …`.

Only operation keys, customer ids, periods, states, counts and short codes go in; never an
address, a name or digest content (design: the operation key is the trace).
"""

import logging

logger = logging.getLogger("digest_pipeline")


def _fmt(value: object) -> str:
    text = str(value)
    return f'"{text}"' if (" " in text or not text) else text


def log_event(event: str, level: int = logging.INFO, **fields: object) -> None:
    """Logs `event=<event>` followed by the fields in the order given."""
    if logger.isEnabledFor(level):
        parts = " ".join(f"{k}={_fmt(v)}" for k, v in fields.items() if v is not None)
        logger.log(level, "event=%s %s", event, parts)
