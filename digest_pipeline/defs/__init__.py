"""This project's code location: the executor and one `WeeklyDigest` instance (`weekly_digest/`).

`digest_pipeline.definitions` autoloads this folder. The graph itself is built by the component
(`digest_pipeline/component/`); `weekly_digest/defs.yaml` is this project's instance of it.
"""
