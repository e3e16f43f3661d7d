"""The team's own assets the digest reads (`asset:` in `DIGEST_SOURCE_CONFIG`), as dependencies.

The week's snapshot depends on the asset that writes the customers, its content on those that
write the products and orders, so the UI's lineage runs from the team's data to the digest. Read
when the definitions load, as the partitions' first week is.
"""

import os
from pathlib import Path

import dagster as dg

from digest_pipeline.source_settings import read_source


def upstream(*kinds: str) -> list[dg.AssetKey]:
    """The asset keys the source config names for `kinds`, in that order (none by default)."""
    source = read_source(os.environ, Path.cwd())
    return [dg.AssetKey(list(a)) for k in kinds if (a := source.entity(k).asset) is not None]
