"""Dagster wiring only: partitions, resources, assets, checks, schedule and sensor.

`digest_pipeline.definitions` autoloads every module here; each one reads resources, calls a
service and turns its report into metadata or check results, and holds no business rule.
"""
