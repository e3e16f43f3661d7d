"""The example shop's own Dagster project: its tables as assets, and the weekly digest beside them."""
