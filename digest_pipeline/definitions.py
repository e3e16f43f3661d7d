"""The project's Dagster definitions: everything under `digest_pipeline/defs/`, autoloaded."""

from pathlib import Path

import dagster as dg


@dg.definitions
def defs() -> dg.Definitions:
    """Loads the assets, checks, schedule, sensor and resources from the defs folder."""
    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
