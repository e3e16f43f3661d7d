"""The shop's code location: everything under `own_shop/defs/`, autoloaded.

Its own assets (`defs/shop_tables.py`), and two instances of the digest component, each a
`defs.yaml`: the weekly digest for every customer (`defs/weekly_digest/`) and a second one,
`vip_digest`, with its own ledger, outbox and look (`defs/vip_digest/`).
"""

from pathlib import Path

import dagster as dg


@dg.definitions
def defs() -> dg.Definitions:
    """The shop's tables and both digests."""
    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
