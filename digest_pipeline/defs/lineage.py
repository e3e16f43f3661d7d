"""The team's own assets the digest reads (`asset:` in `DIGEST_SOURCE_CONFIG`), as dependencies.

The week's snapshot depends on the asset that writes the customers, its content on those that
write the products and orders, so the UI's lineage runs from the team's data to the digest. Read
when the definitions load, as the partitions' first week is.
"""

import functools
import os
from pathlib import Path

import dagster as dg

from digest_pipeline.source_settings import SourceSettings, read_source


@functools.cache
def _source() -> SourceSettings:
    """The source settings, read once for all the assets that ask."""
    return read_source(os.environ, Path.cwd())


def upstream(*kinds: str) -> list[dg.AssetKey]:
    """The asset keys the source config names for `kinds`, in that order (none by default)."""
    source = _source()
    return [dg.AssetKey(list(a)) for k in kinds if (a := source.entity(k).asset) is not None]
