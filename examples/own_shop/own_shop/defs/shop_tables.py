"""The shop's tables, written by its own pipeline, as external assets.

`make_shop.py` writes them here (dbt or an export in a real shop). The digest's snapshot and
content depend on them through `asset:` in shop.yaml, so the asset graph shows the shop's data
flowing into each digest.
"""

import dagster as dg

SHOP_TABLES = [
    dg.AssetSpec(
        ["shop", name],
        description=f"The shop's `{name}` table, written by its own pipeline.",
        group_name="shop",
    )
    for name in ("users", "catalog_items", "purchases")
]

defs = dg.Definitions(assets=SHOP_TABLES)
