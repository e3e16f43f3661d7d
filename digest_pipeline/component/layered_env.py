"""An instance's environment: the process's `DIGEST_*` variables with the instance's own over them.

Its own module, free of Dagster, so the `digest` command can read an instance's settings
without importing the graph.
"""

import os
from collections.abc import Mapping


def instance_env(
    settings: Mapping[str, str], env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment an instance's settings are read from: `env` with `settings` laid over it."""
    merged = dict(os.environ if env is None else env)
    merged.update(settings)
    return merged
