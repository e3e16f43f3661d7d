"""The shop's code location: its own assets and the digest's, in one set of definitions.

The shop's tables are written by its own pipeline (`make_shop.py` here; dbt or an export in a
real shop), so they are external assets: the digest's snapshot and content depend on them
through `asset:` in shop.yaml, and the asset graph shows the shop's data flowing into the digest.
"""

import dagster as dg

from digest_pipeline import definitions as digest

SHOP_TABLES = [
    dg.AssetSpec(
        ["shop", name],
        description=f"The shop's `{name}` table, written by its own pipeline.",
        group_name="shop",
    )
    for name in ("users", "catalog_items", "purchases")
]


@dg.definitions
def defs() -> dg.Definitions:
    """The shop's tables and the weekly digest."""
    # the digest module, not its `defs`: Dagster allows one @definitions function per module
    return dg.Definitions.merge(dg.Definitions(assets=SHOP_TABLES), digest.defs())
